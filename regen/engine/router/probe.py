"""Probes: asking an endpoint out of rotation whether it generates again.

The default, :func:`http_probe`, asks SGLang's ``/health_generate``, which generates a token,
not ``/health``, which does not; :func:`keyed_probe` sends each endpoint its own key.

Owns no files.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from regen.client.endpoints import server_root

#: async (url) -> True when the endpoint answers again
ProbeFn = Callable[[str], Awaitable[bool]]

#: seconds a probe waits: SGLang's /health_generate itself waits up to 20 s for the scheduler
PROBE_TIMEOUT_S = 30.0


async def http_probe(
    url: str, *, headers: dict[str, str] | None = None, timeout_s: float = PROBE_TIMEOUT_S
) -> bool:
    """Default probe: ``GET {root}/health_generate`` answers 200 (SGLang generates one token:
    a busy server passes, a hung one does not; ``/health`` would answer without generating).
    A server without that route (404/405, e.g. ``transformers serve``) is asked
    ``GET {url}/models`` instead, with ``headers`` (the API key)."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        try:
            async with http.get(f"{server_root(url)}/health_generate") as resp:
                if resp.status == 200:
                    return True
                if resp.status not in (404, 405):
                    return False
            async with http.get(f"{url}/models", headers=headers or {}) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False


def keyed_probe(headers_by_url: dict[str, dict[str, str]]) -> ProbeFn:
    """:func:`http_probe` that sends each endpoint its own ``Authorization`` header."""

    async def probe(url: str) -> bool:
        return await http_probe(url, headers=headers_by_url.get(url))

    return probe
