"""The bench run: both servers checked, warmed up, then every level on each, one after another.

Order of events (the two servers never run at the same time, so they never compete for the
client's CPU or a shared GPU)::

    model      --model, else the one model the baseline lists at /v1/models; both servers
               must serve it (regen.client.check_endpoint)
    flags      /server_info of both (regen.bench.servers): checked, recorded, never fatal
    warm-up    one request to each (the first prompt); a failure stops the bench. Whether the
               speculative server returns sglext.spec_tokens_details decides how acceptance
               is measured
    levels     for each concurrency, ascending: baseline, then speculative (regen.bench.load);
               without per-request details, the speculative server's avg_spec_accept_length
               (vLLM: its vllm:spec_decode_* counters) is read before and after its level
    pass       only without per-request details: the speculative server again, one source at
               a time at the lowest concurrency, avg_spec_accept_length read around each, so
               each source gets its own acceptance

The requests are identical for both servers: the same body bytes, built once per prompt by
the chat client's own request builder with the manifest's sampling (streaming, usage
included, ``max_tokens`` from ``--max-tokens``, ``return_spec_tokens_details: true``, which
a server that does not know it ignores). Owns no files.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from regen.bench.load import (
    BenchRequest,
    LevelRun,
    ProgressHook,
    RequestRecord,
    run_level,
    send_one,
)
from regen.bench.report import ServerFlags
from regen.bench.servers import Role, read_accept_length, server_flags
from regen.bench.stats import AcceptWindow, CounterWindow, decode_tokens
from regen.client import ChatClient, check_endpoint, resolve_api_key, server_root
from regen.client.chat import NO_KEY
from regen.client.endpoints import served_models
from regen.client.transport import ChatTransport
from regen.core.errors import ConfigError, EndpointError, RegenError
from regen.manifest import Endpoint, Sampling, public_url
from regen.serve.vllm import read_counters
from regen.store.holdout import BenchPrompt

log = logging.getLogger(__name__)

ROLES: tuple[Role, Role] = ("baseline", "speculative")


@dataclass(slots=True)
class BenchOptions:
    """What to bench and how (the CLI's flags, resolved)."""

    baseline: str  #: server URL (root or OpenAI base)
    speculative: str
    prompts: list[BenchPrompt]
    sampling: Sampling
    concurrency: list[int]
    max_tokens: int
    model: str | None = None  #: None: the one model the baseline serves
    api_key_env: str | None = None  #: environment variable holding the key of both servers
    draft: str | None = None  #: the draft the speculative server must serve (optional check)
    request_timeout_s: float = 600.0
    adapters: dict[str, str] = field(default_factory=dict)  #: source → adapter, when known
    #: the requests' chat_template_kwargs (the manifest's: its family's thinking switch)
    template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class BenchRun:
    """Everything measured, before it is summarized (regen.bench.summary)."""

    model: str
    flags: dict[Role, ServerFlags]
    levels: list[LevelRun]  #: both roles, in the order run
    details: bool  #: whether the speculative server returned spec_tokens_details
    fresh: bool  #: whether its running acceptance total started with the bench
    #: per level (no details); CounterWindow for vLLM (its counters), else AcceptWindow
    windows: dict[int, AcceptWindow | CounterWindow] = field(default_factory=dict)
    source_windows: dict[str, AcceptWindow | CounterWindow] = field(default_factory=dict)
    counters: bool = False  #: acceptance from vLLM's /metrics counters
    passes: list[LevelRun] = field(default_factory=list)  #: the per-source pass's runs
    warmup: dict[Role, RequestRecord] = field(default_factory=dict)


def _counters_or_none(url: str, api_key: str | None) -> Any:
    """vLLM's speculative counters now (None: unreadable or not speculating)."""

    try:
        return read_counters(url, api_key=api_key)
    except RegenError:
        return None


def check_options(opts: BenchOptions) -> list[int]:
    """Validate the options; returns the concurrency levels, ascending and distinct."""
    if not opts.prompts:
        raise ConfigError("no prompts to send")
    if not opts.concurrency or any(c < 1 for c in opts.concurrency):
        raise ConfigError("--concurrency needs levels >= 1, e.g. 1,4,16,64", field="concurrency")
    if opts.max_tokens < 1:
        raise ConfigError("--max-tokens must be >= 1", field="max_tokens")
    for flag, url in (("baseline", opts.baseline), ("speculative", opts.speculative)):
        if not url.startswith(("http://", "https://")):  # the manifest's endpoint rule
            raise ConfigError(f"--{flag} {url!r} must start with http:// or https://", field=flag)
    if server_root(opts.baseline) == server_root(opts.speculative):
        raise ConfigError("--baseline and --speculative are the same server", field="speculative")
    return sorted(set(opts.concurrency))


def build_requests(
    prompts: list[BenchPrompt],
    *,
    model: str,
    sampling: Sampling,
    max_tokens: int,
    template_kwargs: dict[str, Any] | None = None,
) -> list[BenchRequest]:
    """One request per prompt, its body built by the chat client's own request builder."""
    # streamed (TTFT is measured), no token ids: only the speculative statistics are asked for
    s = sampling.model_copy(update={"max_tokens": max_tokens, "token_ids": "local"})
    builder = ChatClient(Endpoint(url="http://bench.invalid/v1"), model=model, sampling=s,
                         template_kwargs=template_kwargs)  # fmt: skip
    out = []
    for p in prompts:
        body = builder.request_body(p.messages, p.tools)
        body["return_spec_tokens_details"] = True
        out.append(BenchRequest(source=p.source, sample_id=p.sample_id, body=body))
    return out


async def resolve_model(endpoints: dict[Role, Endpoint], model: str | None) -> str:
    """``model``, or the baseline's only model; both servers must serve it."""
    import httpx2

    async with httpx2.AsyncClient(timeout=10.0) as http:
        if model is None:
            served = list(await served_models(endpoints["baseline"], http=http))
            if len(served) != 1:
                listed = ", ".join(served) or "none"
                raise ConfigError(
                    f"the baseline server serves {len(served)} models ({listed}): pass --model",
                    field="model",
                )
            model = served[0]
        for ep in endpoints.values():
            await check_endpoint(ep, model, http=http)
    return model


async def run_bench(opts: BenchOptions, progress: ProgressHook | None = None) -> BenchRun:
    """Run the whole bench (see the module docstring for the order of events)."""
    levels = check_options(opts)
    endpoints: dict[Role, Endpoint] = {
        "baseline": Endpoint(url=server_root(opts.baseline) + "/v1", api_key_env=opts.api_key_env),
        "speculative": Endpoint(
            url=server_root(opts.speculative) + "/v1", api_key_env=opts.api_key_env
        ),
    }
    key = resolve_api_key(endpoints["baseline"])
    info_key = None if key == NO_KEY else key
    model = await resolve_model(endpoints, opts.model)
    flags: dict[Role, ServerFlags] = {}
    for role in ROLES:
        flags[role] = await asyncio.to_thread(
            server_flags, role, endpoints[role].url, api_key=info_key, draft=opts.draft
        )
    requests = build_requests(
        opts.prompts,
        model=model,
        sampling=opts.sampling,
        max_tokens=opts.max_tokens,
        template_kwargs=opts.template_kwargs,
    )
    transports = {
        role: ChatTransport(
            endpoints[role].url, key, opts.request_timeout_s, shown=public_url(endpoints[role].url)
        )
        for role in ROLES
    }
    spec_url = endpoints["speculative"].url

    counters = flags["speculative"].engine == "vllm"

    async def accept_now() -> Any:
        """The running acceptance (SGLang) or the speculative counters (vLLM) now."""
        if counters:
            return await asyncio.to_thread(_counters_or_none, spec_url, info_key)
        return await asyncio.to_thread(read_accept_length, spec_url, api_key=info_key)

    def window(before: Any, after: Any, tokens_before: int, tokens: int, fresh: bool) -> Any:
        if counters:
            return CounterWindow(before, after)
        return AcceptWindow(before, after, tokens_before, tokens, fresh)

    try:
        run = BenchRun(
            model=model,
            flags=flags,
            levels=[],
            details=False,
            fresh=counters or flags["speculative"].accept_length_at_start is None,
            counters=counters,
        )
        for role in ROLES:
            rec = await send_one(transports[role], requests[0], role=role, concurrency=1)
            if not rec.ok:
                raise EndpointError(
                    f"{role} server {public_url(endpoints[role].url)}: the warm-up request "
                    f"failed ({rec.error}{f', HTTP {rec.status}' if rec.status else ''})"
                )
            run.warmup[role] = rec
        run.details = run.warmup["speculative"].verify_ct is not None
        spec_tokens = decode_tokens([run.warmup["speculative"]])
        if not run.details:
            log.info(
                "the speculative server returns no spec_tokens_details: acceptance comes "
                "from %s", "its /metrics counters" if counters else
                "/server_info avg_spec_accept_length",
            )  # fmt: skip
        for c in levels:
            for role in ROLES:
                before = None if run.details or role == "baseline" else await accept_now()
                lv = await run_level(
                    transports[role], requests, role=role, concurrency=c, progress=progress
                )
                run.levels.append(lv)
                if role == "speculative" and not run.details:
                    tokens = decode_tokens(lv.records)
                    run.windows[c] = window(
                        before, await accept_now(), spec_tokens, tokens, run.fresh
                    )
                    spec_tokens += tokens
        if not run.details and any(w.after is not None for w in run.windows.values()):
            # one source at a time: the server's counters then belong to that source alone
            by_source: dict[str, list[BenchRequest]] = {}
            for r in requests:
                by_source.setdefault(r.source, []).append(r)
            for source, reqs in by_source.items():
                before = await accept_now()
                lv = await run_level(
                    transports["speculative"],
                    reqs,
                    role="pass",
                    concurrency=levels[0],
                    progress=progress,
                )
                run.passes.append(lv)
                tokens = decode_tokens(lv.records)
                run.source_windows[source] = window(
                    before, await accept_now(), spec_tokens, tokens, run.fresh
                )
                spec_tokens += tokens
        return run
    finally:
        for s in transports.values():
            await s.aclose()
