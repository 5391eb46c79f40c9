"""All numbers of a run from what one refresh read (:func:`compute`).

Puts the parts together: the run's state (regen.status.state), each source's counters less
what vanished from the parts (:func:`shown`, regen.status.files), the rates and the ETA
(regen.status.rates), the endpoints the driver reported beside those configured, the errors,
and the settings a ``regen run --force`` mixed (:func:`settings_differ`).

Pure functions of those records and ``now``; owns no files.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from regen.status.files import RunFiles
from regen.status.rates import RATE_WINDOWS_S, estimate_eta, last_growth_at, length_cv, window_rate
from regen.status.records import (
    EndpointNumbers,
    ErrorNumbers,
    RunNumbers,
    SourceNumbers,
    by_count,
)
from regen.status.state import (
    ENDED,
    LIVE,
    STALL_AFTER_S,
    read_holder,
    run_state,
    stall_limit,
)
from regen.store.counts import SourceCounts
from regen.store.layout import RunRecord
from regen.store.lock import pid_is_alive
from regen.store.progress import ProgressSnapshot, SourceProgress


def compute(
    files: RunFiles,
    *,
    now: float,
    assumptions: dict[str, tuple[int, int]] | None = None,
    turns: dict[str, float] | None = None,
    uri: str = "",
    stall_after_s: float = STALL_AFTER_S,
    hostname: str | None = None,
    pid_alive: Callable[[int], bool] = pid_is_alive,
) -> RunNumbers:
    """All numbers of a run from what one refresh read; ``now`` is injected (epoch seconds)."""
    p, run = files.progress, files.run
    holder = read_holder(files.lock, now, hostname=hostname, pid_alive=pid_alive)
    series = p.token_series if p else []
    growth = last_growth_at(series)
    limit = stall_limit(p, stall_after_s, hostname)
    state, reason = run_state(p, holder, growth, now, limit, files.progress_error)
    srcs = sources(files)
    overall = SourceProgress.sum(srcs)
    overall.flags, overall.ended = by_count(overall.flags), by_count(overall.ended)
    rates = [window_rate(series, w) for w in RATE_WINDOWS_S]
    edges = list(p.output_tokens_hist.edges) if p else []
    counts = list(p.output_tokens_hist.counts) if p else []
    eta = estimate_eta(srcs, rates, assumptions or {}, length_cv(edges, counts), turns)
    if state in ENDED and eta is not None and eta.tokens > 0:
        eta = None  # nobody is working on it: no time estimate
    configured = list(p.endpoints_configured) if p else list(run.endpoints if run else [])
    live = state in LIVE
    return RunNumbers(
        uri=uri,
        now=now,
        state=state,
        state_reason=reason,
        **_identity(p, run),
        **_clocks(p, run, now, live),
        endpoints_configured=configured,
        overall=overall,
        session_tokens=series[-1][1] if series else 0,
        in_flight=p.in_flight if p and live else 0,
        requests=_requests(p),
        rates=rates,
        eta=eta,
        sources=srcs,
        errors=_errors(p),
        endpoints=endpoints(p, configured, live),
        hist_edges=edges,
        hist_counts=counts,
        holder=holder,
        last_progress_at=growth,
        damaged=list(files.parts.damaged) if files.parts else [],
        settings_differ=settings_differ(overall.settings, run),
    )


class _Identity(TypedDict):
    name: str
    model: str
    session: str
    host: str
    pid: int


class _Clocks(TypedDict):
    run_started_at: float | None
    started_at: float | None
    updated_at: float | None
    elapsed_s: float
    session_elapsed_s: float


def _identity(p: ProgressSnapshot | None, run: RunRecord | None) -> _Identity:
    """The run's name and model, and the session that wrote the progress file."""
    return {
        "name": p.name if p else (run.name if run else ""),
        "model": p.model if p else (run.model if run else ""),
        "session": p.session if p else "",
        "host": p.host if p else "",
        "pid": p.pid if p else 0,
    }


def _clocks(p: ProgressSnapshot | None, run: RunRecord | None, now: float, live: bool) -> _Clocks:
    """When the run and the session started and were last written, and how long they ran (to
    now while the run is live, else to the last update)."""
    end = now if live or p is None else p.updated_at
    run_start = p.run_started_at if p else (run.created_at if run else None)
    return {
        "run_started_at": run_start,
        "started_at": p.started_at if p else None,
        "updated_at": p.updated_at if p else None,
        "elapsed_s": max(0.0, end - run_start) if run_start else 0.0,
        "session_elapsed_s": max(0.0, end - p.started_at) if p else 0.0,
    }


def _requests(p: ProgressSnapshot | None) -> dict[str, int]:
    return {
        "sent": p.requests.sent if p else 0,
        "ok": p.requests.ok if p else 0,
        "retried": p.requests.retried if p else 0,
        "failed": p.requests.failed if p else 0,
    }


def _errors(p: ProgressSnapshot | None) -> list[ErrorNumbers]:
    """The errors by kind, most first."""
    return sorted(
        (ErrorNumbers(k, e.count, e.last_message, e.last_at) for k, e in p.errors.items())
        if p
        else [],
        key=lambda e: (-e.count, e.kind),
    )


def sources(files: RunFiles) -> list[SourceNumbers]:
    """Each source as status shows it: the progress file's counters (the part records' while
    it cannot be read) less what vanished from the parts."""
    check = files.parts
    per_source = files.progress.sources if files.progress else files.fallback
    return [shown(name, sp, check.deficit.get(name) if check else None)
            for name, sp in per_source.items()]  # fmt: skip


def endpoints(
    p: ProgressSnapshot | None, configured: list[str], live: bool
) -> list[EndpointNumbers]:
    """What the driver reported of each endpoint (its in-flight and server numbers only while
    the run is live), plus the configured ones it did not report."""
    eps = [
        EndpointNumbers(
            e.url,
            e.in_flight if live else 0,
            e.healthy,
            e.latency_p50_s,
            e.ok,
            e.errors,
            *((e.server_running, e.server_queued, e.server_kv_usage) if live else (None,) * 3),
            health=e.health,
            stalls=e.stalls,
            cache_prompt_tokens=e.cache_prompt_tokens,
            cached_tokens=e.cached_tokens,
        )
        for e in (p.endpoints if p else [])
    ]
    seen = {e.url for e in eps}
    return eps + [EndpointNumbers(u, 0, None, None, 0, 0) for u in configured if u not in seen]


def settings_differ(samples: dict[str, int], run: RunRecord | None) -> dict[str, dict[str, Any]]:
    """For the settings ids the samples carry, when there are several: each id's values of the
    fields in which they differ (from run.json; an id it does not describe has none)."""
    if len(samples) < 2:
        return {}
    known = run.settings if run is not None else {}
    fields_of = {sid: known.get(sid, {}) for sid in samples}
    names = sorted({k for f in fields_of.values() for k in f})
    differ = [k for k in names if len({repr(f.get(k)) for f in fields_of.values()}) > 1]
    return {sid: {k: f.get(k) for k in differ} for sid, f in fields_of.items()}


def shown(name: str, sp: SourceProgress, gap: SourceCounts | None) -> SourceNumbers:
    """Source ``name`` as status shows it: its counters less what vanished (``gap``)."""
    counts = sp.less(*([gap] if gap is not None else []))
    counts.flags, counts.ended = by_count(counts.flags), by_count(counts.ended)
    return SourceNumbers(**{**dict(sp), **dict(counts), "name": name, "pending": None})
