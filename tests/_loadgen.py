"""A minimal load generator for the simulator: N concurrent raw streaming requests.

It reads the SSE bytes without parsing them (so it costs the client as little as possible) and
is used by the capacity tests and by ``tests/devkit/simulate/measure_ceiling.py`` (the simulator's
own ceiling, docs/simulate.md). Owns no files.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass


@dataclass(slots=True)
class LoadResult:
    requests: int  #: completed requests
    failed: int  #: requests that did not end with [DONE]
    wall_s: float  #: first request sent to last answer read
    stream_bytes: int

    @property
    def req_per_s(self) -> float:
        return self.requests / self.wall_s if self.wall_s else 0.0


def make_body(i: int, model: str, max_tokens: int | None, stream: bool = True) -> bytes:
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": f"load request number {i}"}],
        "stream": stream,
        "stream_options": {"include_usage": True},
    }
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return json.dumps(body).encode()


async def run_load(
    url: str,
    *,
    requests: int,
    concurrency: int,
    model: str = "moonshotai/Kimi-K2.5",
    max_tokens: int | None = None,
    first: int = 0,
    timeout_s: float = 120.0,
) -> LoadResult:
    """Send ``requests`` streaming requests to ``url`` (the ``.../v1`` base), ``concurrency``
    at a time; each worker sends its next request as soon as the previous one ends."""
    import aiohttp

    next_i = first
    done = failed = nbytes = 0
    end = first + requests
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    headers = {"Content-Type": "application/json"}

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            nonlocal next_i, done, failed, nbytes
            while next_i < end:
                i = next_i
                next_i += 1
                body = make_body(i, model, max_tokens)
                ok = False
                try:
                    async with session.post(
                        f"{url}/chat/completions", data=body, headers=headers
                    ) as r:
                        tail = b""
                        async for chunk in r.content.iter_any():
                            nbytes += len(chunk)
                            tail = (tail + chunk)[-32:]
                        ok = r.status == 200 and tail.endswith(b"data: [DONE]\n\n")
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                done += ok
                failed += not ok

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return LoadResult(done, failed, wall, nbytes)
