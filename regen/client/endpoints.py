"""Endpoint checks at start: is each server up, and does it serve the manifest's model?

For every endpoint: ``GET {url}/models`` (the url includes ``/v1``) must list the model; then
SGLang's ``/server_info`` (or the older ``/get_server_info``) at the server root is read when
present, for ``max_running_requests``, the speculative settings and the version. Endpoints
that fail are dropped with a warning; when none is usable, one :class:`EndpointError` lists
every endpoint and why.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regen.client.chat import NO_KEY, resolve_api_key
from regen.errors import EndpointError
from regen.manifest import Endpoint, public_url

log = logging.getLogger(__name__)

#: server_info keys kept as the endpoint's speculative settings
SPECULATIVE_KEYS = (
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)

#: (timeout_s) -> an ``httpx2.AsyncClient``-like client (injectable for tests)
HttpFactory = Callable[[float], Any]


@dataclass(slots=True)
class EndpointInfo:
    """What a usable endpoint told us at start."""

    url: str  #: base URL including /v1
    weight: float
    models: tuple[str, ...]  #: ids listed by /v1/models
    max_model_len: int | None = None
    max_running_requests: int | None = None  #: SGLang's batch slots (None: not reported)
    version: str | None = None
    speculative: dict[str, Any] = field(default_factory=dict)
    server_info: bool = False  #: whether /server_info answered

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "weight": self.weight,
            "models": list(self.models),
            "max_model_len": self.max_model_len,
            "max_running_requests": self.max_running_requests,
            "version": self.version,
            "speculative": dict(self.speculative),
        }


def server_root(url: str) -> str:
    """The server root of a base URL (``http://h:p/v1`` → ``http://h:p``)."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _default_http(timeout_s: float) -> Any:
    import httpx2

    return httpx2.AsyncClient(timeout=timeout_s)


async def check_endpoint(
    endpoint: Endpoint,
    model: str,
    *,
    http: Any,
    base_dir: str | Path = ".",
) -> EndpointInfo:
    """Check one endpoint; raises EndpointError with the reason when it is not usable."""
    headers = {}
    key = resolve_api_key(endpoint, base_dir)
    if key != NO_KEY:
        headers["Authorization"] = f"Bearer {key}"
    url = endpoint.url
    shown = public_url(url)  # messages never carry user:password
    try:
        resp = await http.get(f"{url}/models", headers=headers)
    except Exception as e:
        raise EndpointError(f"{shown}: unreachable ({type(e).__name__})") from None
    if resp.status_code != 200:
        raise EndpointError(f"{shown}: GET /models answered HTTP {resp.status_code}")
    try:
        data = resp.json().get("data") or []
        entries = {str(d["id"]): d for d in data if isinstance(d, dict) and "id" in d}
    except (ValueError, AttributeError, TypeError):
        raise EndpointError(f"{shown}: GET /models did not return a model list") from None
    if model not in entries:
        served = ", ".join(repr(m) for m in entries) or "none"
        raise EndpointError(f"{shown}: does not serve model {model!r} (it serves: {served})")
    info = EndpointInfo(url=url, weight=endpoint.weight, models=tuple(entries))
    mml = entries[model].get("max_model_len")
    info.max_model_len = mml if isinstance(mml, int) else None
    await _read_server_info(info, http, headers)
    return info


async def _read_server_info(info: EndpointInfo, http: Any, headers: dict[str, str]) -> None:
    root = server_root(info.url)
    for path in ("/server_info", "/get_server_info"):
        try:
            resp = await http.get(f"{root}{path}", headers=headers)
        except Exception:
            return
        if resp.status_code != 200:
            continue
        try:
            data = resp.json()
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        info.server_info = True
        mrr = data.get("max_running_requests")
        info.max_running_requests = mrr if isinstance(mrr, int) and mrr > 0 else None
        version = data.get("version")
        info.version = str(version) if version is not None else None
        info.speculative = {k: data[k] for k in SPECULATIVE_KEYS if data.get(k) is not None}
        return


async def check_endpoints(
    endpoints: list[Endpoint],
    model: str,
    *,
    timeout_s: float = 10.0,
    http_factory: HttpFactory | None = None,
    base_dir: str | Path = ".",
) -> list[EndpointInfo]:
    """Check all endpoints concurrently; return the usable ones in the given order.

    Unusable endpoints are dropped with a warning; if none is usable, raise one EndpointError
    naming every endpoint and why.
    """
    if not endpoints:
        raise EndpointError("no endpoints given (manifest 'endpoints' or --endpoint)")
    http = (http_factory or _default_http)(timeout_s)
    try:
        results = await asyncio.gather(
            *(check_endpoint(e, model, http=http, base_dir=base_dir) for e in endpoints),
            return_exceptions=True,
        )
    finally:
        await http.aclose()
    usable: list[EndpointInfo] = []
    problems: list[str] = []
    for r in results:
        if isinstance(r, EndpointInfo):
            usable.append(r)
        elif isinstance(r, EndpointError):
            problems.append(str(r))
        elif isinstance(r, BaseException):
            raise r
    if not usable:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise EndpointError(f"no usable endpoint for model {model!r}:\n{lines}")
    for p in problems:
        log.warning("endpoint dropped: %s", p)
    for info in usable:
        log.info(
            "endpoint %s ok (max_running_requests=%s, version=%s%s)",
            public_url(info.url),
            info.max_running_requests,
            info.version,
            f", speculative={info.speculative}" if info.speculative else "",
        )
    return usable
