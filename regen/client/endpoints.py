"""Endpoint checks at start: is each server up, does it serve the manifest's model, and which
engine is it?

For every endpoint: ``GET {url}/models`` (the url includes ``/v1``) must list the model; then
the engine is recognised (:func:`regen.client.profiles.identify`): SGLang's ``/server_info``
(or the older ``/get_server_info``) at the server root gives the batch slots, the speculative
settings, deterministic inference and the version; vLLM's ``/version`` and ``vllm:`` metrics
give the version and whether it speculates (vLLM reports no batch slots: ``engine.concurrency``
sizes the in-flight limits); any other server is an OpenAI-compatible one of no known engine.
Every request carries the endpoint's API key (``Authorization: Bearer``; SGLang's and vLLM's
``--api-key`` guard the API). Endpoints that fail are dropped with a warning; when none is
usable, one :class:`EndpointError` lists every endpoint and why.

Batch slots (what sizes the in-flight limits): SGLang's top-level ``max_running_requests`` is
the ``--max-running-requests`` flag, None unless it was given; the live value is
``internal_states[i].effective_max_running_requests_per_dp``, one entry per data-parallel
rank, so the slots are their sum. The flag wins when set; :attr:`EndpointInfo.slots_source`
says which value was used, and the start log names it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from regen.client.chat import token_path
from regen.client.errors import url_hint
from regen.client.http import JsonClient, JsonGetter
from regen.client.profiles import identify, profile_named
from regen.client.resolved import KeySource, ResolvedEndpoint, auth_headers
from regen.core.errors import EndpointError
from regen.manifest import Endpoint, Sampling, public_url

log = logging.getLogger(__name__)

#: an identity check that took this part of the client's timeout or more, and found no engine,
#: waited for routes that did not answer: a hung server, not a plain OpenAI one
IDENTITY_HANG_PART = 0.9

#: (timeout_s) -> an ``httpx2.AsyncClient``-like client (injectable for tests)
HttpFactory = Callable[[float], JsonClient]
#: what run.json's ``engines`` records of one endpoint (regen.store.layout.EngineRecord's fields)
EngineFields = dict[str, str | None]


@dataclass(slots=True)
class EndpointInfo:
    """What a usable endpoint told us at start."""

    url: str  #: base URL including /v1
    weight: float
    models: tuple[str, ...]  #: ids listed by /v1/models
    max_model_len: int | None = None
    max_running_requests: int | None = None  #: SGLang's batch slots (None: not reported)
    #: where max_running_requests came from: "max_running_requests" (the server flag),
    #: "internal_states" (the live per-DP values, summed), or None (not reported)
    slots_source: str | None = None
    #: SGLang's --max-queued-requests over its DP ranks (None: not reported): the start's
    #: first requests are paced so its queue never takes more (regen.engine.adaptive)
    max_queued_requests: int | None = None
    #: the server reports --enable-deterministic-inference (None: no /server_info)
    deterministic: bool | None = None
    version: str | None = None
    speculative: dict[str, object] = field(default_factory=dict)
    server_info: bool = False  #: whether /server_info answered
    #: the engine profile recognised (regen.client.profiles): "sglang", "vllm", "openai"
    engine: str = "openai"
    #: where the endpoint's API key is read from (the manifest's endpoint: never the key)
    key: KeySource = field(default_factory=KeySource)

    def resolved(self) -> ResolvedEndpoint:
        """The endpoint as a run's workers use it (regen.client.resolved)."""
        return ResolvedEndpoint(
            url=self.url,
            profile=profile_named(self.engine),
            key=self.key,
            version=self.version,
            max_running_requests=self.max_running_requests,
            weight=self.weight,
            slots_source=self.slots_source,
            max_queued_requests=self.max_queued_requests,
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "url": self.url,
            "weight": self.weight,
            "models": list(self.models),
            "max_model_len": self.max_model_len,
            "max_running_requests": self.max_running_requests,
            "slots_source": self.slots_source,
            "max_queued_requests": self.max_queued_requests,
            "deterministic": self.deterministic,
            "version": self.version,
            "speculative": dict(self.speculative),
            "engine": self.engine,
        }


def server_root(url: str) -> str:
    """The server root of a base URL (``http://h:p/v1`` → ``http://h:p``; trailing slashes
    dropped)."""
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")].rstrip("/")
    return base


def _default_http(timeout_s: float) -> JsonClient:
    import httpx2

    client: JsonClient = httpx2.AsyncClient(timeout=timeout_s)
    return client


async def served_models(
    endpoint: Endpoint, *, http: JsonGetter, base_dir: str | Path = "."
) -> dict[str, dict[str, object]]:
    """``GET {url}/models``: the served model ids and their entries; raises EndpointError with
    the reason (unreachable, the key, no model list)."""
    shown = public_url(endpoint.url)  # messages never carry user:password
    headers = auth_headers(KeySource.of(endpoint, base_dir).read(shown))
    try:
        resp = await http.get(f"{endpoint.url}/models", headers=headers)
    except Exception as e:
        raise EndpointError(f"{shown}: unreachable ({type(e).__name__})") from None
    if resp.status_code in (401, 403):
        how = "a wrong key" if headers else "no key (give api_key_env or api_key_file)"
        raise EndpointError(
            f"{shown}: GET /models answered HTTP {resp.status_code}: the server wants an API "
            f"key and regen sent {how}"
        )
    if resp.status_code != 200:
        hint = url_hint(shown) if resp.status_code in (404, 405) else ""
        raise EndpointError(f"{shown}: GET /models answered HTTP {resp.status_code}{hint}")
    try:
        found = resp.json()
        data = found.get("data") or [] if isinstance(found, dict) else None
        if not isinstance(data, Iterable):  # what iterating it would raise
            raise TypeError(data)
        return {str(d["id"]): d for d in data if isinstance(d, dict) and "id" in d}
    except (ValueError, TypeError):
        raise EndpointError(f"{shown}: GET /models did not return a model list") from None


async def check_endpoint(
    endpoint: Endpoint,
    model: str,
    *,
    http: JsonGetter,
    base_dir: str | Path = ".",
    timeout_s: float = 10.0,
) -> EndpointInfo:
    """Check one endpoint; raises EndpointError with the reason when it is not usable
    (``timeout_s``: the ``http`` client's timeout)."""
    key = KeySource.of(endpoint, base_dir)
    headers = auth_headers(key.read(public_url(endpoint.url)))
    url = endpoint.url
    entries = await served_models(endpoint, http=http, base_dir=base_dir)
    if model not in entries:
        served = ", ".join(repr(m) for m in entries) or "none"
        raise EndpointError(
            f"{public_url(url)}: does not serve model {model!r} (it serves: {served})"
        )
    info = EndpointInfo(url=url, weight=endpoint.weight, models=tuple(entries), key=key)
    mml = entries[model].get("max_model_len")
    info.max_model_len = mml if isinstance(mml, int) else None
    asked = time.monotonic()
    found = await identify(http, server_root(url), headers)
    if found.engine == "openai" and time.monotonic() - asked >= IDENTITY_HANG_PART * timeout_s:
        # a hung SGLang serves its model list but not /server_info (the scheduler answers
        # it): taken for a plain OpenAI server, its rows would lose the server's ids
        raise EndpointError(
            f"{public_url(url)}: lists the model but its identity routes (/server_info, "
            f"/version) did not answer within {timeout_s:g} s: a hung server? left out of "
            "this session (a rerun tries it again)"
        )
    info.engine, info.version, info.server_info = found.engine, found.version, found.server_info
    info.max_running_requests, info.slots_source = found.max_running_requests, found.slots_source
    info.max_queued_requests = found.max_queued_requests
    info.deterministic = found.deterministic
    info.speculative = found.speculative
    return info


def engine_records(
    infos: list[EndpointInfo], sampling: Sampling, session: str
) -> dict[str, EngineFields]:
    """What run.json's ``engines`` records for the usable endpoints: public URL -> engine,
    version, token_path (where the rows' ids come from), session."""

    return {
        public_url(i.url): {
            "engine": i.engine,
            "version": i.version,
            "token_path": token_path(profile_named(i.engine), sampling),
            "session": session,
        }
        for i in infos
    }


def describe_endpoint(info: EndpointInfo) -> str:
    """``sglang 0.5.23; its 64 batch slots (/server_info) size the in-flight limits``: what the
    start-up line says of a usable endpoint."""
    engine = f"{info.engine} {info.version}" if info.version else f"{info.engine} (no version)"
    if info.max_running_requests is not None:
        slots = (f"its {info.max_running_requests} batch slots ({info.slots_source}) size the "
                 "in-flight limits")  # fmt: skip
    else:
        slots = "no batch slots reported, so engine.concurrency sizes the in-flight limits"
    spec = f"; speculative {info.speculative}" if info.speculative else ""
    return f"{engine}; {slots}{spec}"


def seed_warnings(infos: list[EndpointInfo], seed: int | None) -> list[str]:
    """One line per SGLang endpoint that will ignore ``seed``: SGLang honours a request's seed
    only with ``--enable-deterministic-inference``. Servers without ``/server_info`` say
    nothing either way and get no line."""
    if seed is None:
        return []
    return [
        f"sampling.seed is {seed} but {public_url(i.url)} does not report "
        "--enable-deterministic-inference: SGLang ignores the seed (answers are not "
        "reproducible)"
        for i in infos
        if i.server_info and not i.deterministic
    ]


async def check_endpoints(
    endpoints: list[Endpoint],
    model: str,
    *,
    timeout_s: float = 10.0,
    http_factory: HttpFactory | None = None,
    base_dir: str | Path = ".",
    seed: int | None = None,
) -> list[EndpointInfo]:
    """Check all endpoints concurrently; return the usable ones in the given order.

    Unusable endpoints are dropped with a warning; if none is usable, raise one EndpointError
    naming every endpoint and why. ``seed`` (the manifest's ``sampling.seed``): warn for every
    endpoint that will ignore it (:func:`seed_warnings`).
    """
    if not endpoints:
        raise EndpointError("no endpoints given (manifest 'endpoints' or --endpoint)")
    http = (http_factory or _default_http)(timeout_s)
    try:
        results = await asyncio.gather(
            *(
                check_endpoint(e, model, http=http, base_dir=base_dir, timeout_s=timeout_s)
                for e in endpoints
            ),
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
        log.info("endpoint %s ok: %s", public_url(info.url), describe_endpoint(info))
    for line in seed_warnings(usable, seed):
        log.warning(line)
    return usable
