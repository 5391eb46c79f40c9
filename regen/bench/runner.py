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
               (vLLM: its vllm:spec_decode_* counters) is read before and after its level. At
               concurrency 1 (one request at a time, every prompt once) it is also read
               between the sources, so that level measures each source too (the readings are
               not in its wall time)
    pass       only without per-request details and no concurrency-1 level: the speculative
               server again, one source at a time at the lowest concurrency, the acceptance
               read around each, so each source gets its own

The requests are identical for both servers, in the same order (the prompts', by source at
concurrency 1): the same body bytes, built once per prompt by
the chat client's own request builder with the manifest's sampling (streaming, usage
included, ``max_tokens`` from ``--max-tokens``, ``return_spec_tokens_details: true``, which
a server that does not know it ignores; at temperature 0 on two vLLM servers,
``return_token_ids: true``: the greedy answers are compared by their ids,
:mod:`regen.bench.greedy`). Owns no files.
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
    level_size,
    run_level,
    send_one,
)
from regen.bench.report import ServerFlags
from regen.bench.servers import Role, read_accept_length, server_flags
from regen.bench.stats import AcceptWindow, CounterWindow, decode_tokens
from regen.client import ChatClient, check_endpoint, resolve_api_key, server_root
from regen.client.endpoints import served_models
from regen.client.resolved import NO_KEY
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
    #: the requests' sampling temperature (None: not known, e.g. a run built by hand)
    temperature: float | None = None


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
    token_ids: bool = False,
) -> list[BenchRequest]:
    """One request per prompt, its body built by the chat client's own request builder;
    ``token_ids``: the output ids streamed too (vLLM's ``return_token_ids``), so greedy answers
    are compared by their ids."""
    # streamed (TTFT is measured); the speculative statistics asked for
    s = sampling.model_copy(update={"max_tokens": max_tokens, "token_ids": "local"})
    builder = ChatClient(Endpoint(url="http://bench.invalid/v1"), model=model, sampling=s,
                         template_kwargs=template_kwargs)  # fmt: skip
    out = []
    for p in prompts:
        body = builder.request_body(p.messages, p.tools)
        body["return_spec_tokens_details"] = True
        if token_ids:
            body["return_token_ids"] = True
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


@dataclass(slots=True)
class Acceptance:
    """The speculative server's acceptance read around a level, when its answers carry no
    per-request details: its running average (SGLang's /server_info avg_spec_accept_length)
    or its speculative counters (vLLM's /metrics, ``counters``)."""

    url: str
    api_key: str | None
    counters: bool

    async def now(self) -> Any:
        """The running acceptance (SGLang) or the speculative counters (vLLM) now."""
        if self.counters:
            return await asyncio.to_thread(_counters_or_none, self.url, self.api_key)
        return await asyncio.to_thread(read_accept_length, self.url, api_key=self.api_key)

    def window(
        self, before: Any, after: Any, tokens_before: int, tokens: int, fresh: bool
    ) -> AcceptWindow | CounterWindow:
        """The acceptance of what was sent between the readings ``before`` and ``after``."""
        if self.counters:
            return CounterWindow(before, after)
        return AcceptWindow(before, after, tokens_before, tokens, fresh)


@dataclass(slots=True)
class _Bench:
    """One bench while it runs: its servers and requests; fills ``run``."""

    run: BenchRun
    endpoints: dict[Role, Endpoint]
    transports: dict[Role, ChatTransport]
    requests: list[BenchRequest]
    acceptance: Acceptance
    progress: ProgressHook | None
    spec_tokens: int = 0  #: the speculative server's decode tokens so far

    async def warm_up(self) -> None:
        """One request to each server (a failure stops the bench); whether the speculative
        server returns per-request details decides how acceptance is measured."""
        run = self.run
        for role in ROLES:
            rec = await send_one(self.transports[role], self.requests[0], role=role, concurrency=1)
            if not rec.ok:
                raise EndpointError(
                    f"{role} server {public_url(self.endpoints[role].url)}: the warm-up request "
                    f"failed ({rec.error}{f', HTTP {rec.status}' if rec.status else ''})"
                )
            run.warmup[role] = rec
        run.details = run.warmup["speculative"].verify_ct is not None
        self.spec_tokens = decode_tokens([run.warmup["speculative"]])
        if not run.details:
            log.info(
                "the speculative server returns no spec_tokens_details: acceptance comes "
                "from %s", "its /metrics counters" if run.counters else
                "/server_info avg_spec_accept_length",
            )  # fmt: skip

    async def levels(self, levels: list[int]) -> None:
        """Each level, ascending, on the baseline and then the speculative server; without
        per-request details, the acceptance is read around each speculative level (and
        between its sources at concurrency 1: :meth:`sources_level`)."""
        run = self.run
        once = level_size(len(self.requests), 1) == len(self.requests)
        for c in levels:
            # one request at a time, every prompt once: by source on both servers, the same order
            grouped = c == 1 and once
            requests = self.requests
            if grouped:
                requests = [r for rs in by_source(self.requests).values() for r in rs]
            for role in ROLES:
                measured = role == "speculative" and not run.details
                if measured and grouped:
                    await self.sources_level()
                    continue
                before = await self.acceptance.now() if measured else None
                lv = await run_level(
                    self.transports[role],
                    requests,
                    role=role,
                    concurrency=c,
                    progress=self.progress,
                )
                run.levels.append(lv)
                if measured:
                    run.windows[c] = await self._window(before, lv)

    async def sources_level(self) -> None:
        """The speculative server's concurrency-1 level, one source after another, the
        acceptance read between them: the level's window and each source's. One request at a
        time, so this is the same level as one run over every request; its wall time is its
        runs' (the readings left out) and its records' send times follow from them."""
        spec_tokens = self.spec_tokens
        runs, first = await self._per_source("speculative", 1)
        merged = LevelRun(role="speculative", concurrency=1, wall_s=0.0)
        for lv in runs:
            for rec in lv.records:
                rec.sent_s = None if rec.sent_s is None else rec.sent_s + merged.wall_s
            merged.records += lv.records
            merged.wall_s += lv.wall_s
        merged.full_s = merged.wall_s
        self.run.levels.append(merged)
        tokens = decode_tokens(merged.records)
        self.run.windows[1] = self.acceptance.window(
            first, await self.acceptance.now(), spec_tokens, tokens, self.run.fresh
        )

    async def source_pass(self, concurrency: int) -> None:
        """The speculative server again, one source at a time: the server's counters then
        belong to that source alone."""
        runs, _ = await self._per_source("pass", concurrency)
        self.run.passes += runs

    async def _per_source(self, role: str, concurrency: int) -> tuple[list[LevelRun], Any]:
        """The speculative server, one source at a time, the acceptance read before each and
        after it (each source's window in ``source_windows``); returns the runs and the first
        reading. Progress counts over all of them."""
        groups = by_source(self.requests)
        total = sum(level_size(len(reqs), concurrency) for reqs in groups.values())
        runs: list[LevelRun] = []
        first = None
        for source, reqs in groups.items():
            before = await self.acceptance.now()
            first = before if first is None else first
            done = sum(len(lv.records) for lv in runs)
            progress = self._offset(done, total)
            lv = await run_level(self.transports["speculative"], reqs, role=role,
                                 concurrency=concurrency, progress=progress)  # fmt: skip
            runs.append(lv)
            self.run.source_windows[source] = await self._window(before, lv)
        return runs, first

    def _offset(self, done: int, total: int) -> ProgressHook | None:
        """The progress hook of one source's run among runs of ``total`` requests in all."""
        hook = self.progress
        if hook is None:
            return None
        return lambda role, c, finished, _: hook(role, c, done + finished, total)

    async def _window(self, before: Any, lv: LevelRun) -> AcceptWindow | CounterWindow:
        """The acceptance window of a speculative run that started at reading ``before``."""
        tokens = decode_tokens(lv.records)
        window = self.acceptance.window(
            before, await self.acceptance.now(), self.spec_tokens, tokens, self.run.fresh
        )
        self.spec_tokens += tokens
        return window


def by_source(requests: list[BenchRequest]) -> dict[str, list[BenchRequest]]:
    """The requests by source, the sources in the order they first come."""
    out: dict[str, list[BenchRequest]] = {}
    for r in requests:
        out.setdefault(r.source, []).append(r)
    return out


def bench_endpoints(opts: BenchOptions) -> dict[Role, Endpoint]:
    """Both servers as endpoints (their OpenAI bases), with the key's variable."""
    urls: dict[Role, str] = {"baseline": opts.baseline, "speculative": opts.speculative}
    return {
        role: Endpoint(url=server_root(url) + "/v1", api_key_env=opts.api_key_env)
        for role, url in urls.items()
    }


async def run_bench(opts: BenchOptions, progress: ProgressHook | None = None) -> BenchRun:
    """Run the whole bench (see the module docstring for the order of events)."""
    levels = check_options(opts)
    endpoints = bench_endpoints(opts)
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
        # greedy answers compared by their ids where both servers stream them (vLLM)
        token_ids=opts.sampling.temperature == 0
        and all(f.engine == "vllm" for f in flags.values()),
    )
    transports = {
        role: ChatTransport(
            endpoints[role].url, key, opts.request_timeout_s, shown=public_url(endpoints[role].url)
        )
        for role in ROLES
    }
    counters = flags["speculative"].engine == "vllm"
    acceptance = Acceptance(endpoints["speculative"].url, info_key, counters)
    fresh = counters or flags["speculative"].accept_length_at_start is None
    run = BenchRun(model=model, flags=flags, levels=[], details=False, fresh=fresh,
                   counters=counters, temperature=opts.sampling.temperature)  # fmt: skip
    bench = _Bench(run, endpoints, transports, requests, acceptance, progress)
    try:
        await bench.warm_up()
        await bench.levels(levels)
        measured = any(w.after is not None for w in run.windows.values())
        if not run.details and measured and not run.source_windows:
            await bench.source_pass(levels[0])
        return run
    finally:
        for s in transports.values():
            await s.aclose()
