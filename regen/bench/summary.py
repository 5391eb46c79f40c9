"""From a :class:`regen.bench.runner.BenchRun` to the :class:`BenchReport` (pure, no I/O).

Per level: each server's stats (regen.bench.stats), the speculative server's acceptance
(pooled spec_tokens_details, else its /server_info window), the speedup. Over the bench: the
crossover, the overall acceptance, per source acceptance (pooled details over every level,
else the per-source windows), the greedy answers compared (regen.bench.greedy), then the
verdicts (regen.bench.verdicts).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence

import regen
from regen.bench.greedy import compare_greedy
from regen.bench.load import LevelRun
from regen.bench.report import (
    Acceptance,
    AcceptMethod,
    BenchReport,
    BenchSettings,
    LevelResult,
    SourceResult,
)
from regen.bench.runner import BenchRun
from regen.bench.stats import (
    AcceptWindow,
    CounterWindow,
    crossover,
    details_accept,
    level_stats,
    speedup,
)
from regen.bench.verdicts import source_kind, verdicts
from regen.store.holdout import BenchPrompt


def _overall_window(run: BenchRun) -> AcceptWindow | CounterWindow | None:
    ws = [run.windows[c] for c in sorted(run.windows)]
    if not ws:
        return None
    if run.counters:  # vLLM's counters only move while its levels run
        first, last = ws[0], ws[-1]
        if not (isinstance(first, CounterWindow) and isinstance(last, CounterWindow)):
            raise TypeError("a bench read from counters measures CounterWindows")
        return CounterWindow(first.before, last.after)
    accepts = [w for w in ws if isinstance(w, AcceptWindow)]
    if len(accepts) < len(ws):
        raise TypeError("a bench read from /server_info measures AcceptWindows")
    return AcceptWindow(
        before=accepts[0].before,
        after=accepts[-1].after,
        tokens_before=accepts[0].tokens_before,
        tokens=sum(w.tokens for w in accepts),
        fresh=run.fresh,
    )


def summarize(
    run: BenchRun,
    *,
    settings: BenchSettings,
    prompts: Sequence[BenchPrompt],
    adapters: Mapping[str, str] | None = None,
    now: _dt.datetime | None = None,
) -> BenchReport:
    """The report of a finished bench, verdicts included."""
    by_level: dict[int, dict[str, LevelRun]] = {}
    for lv in run.levels:
        by_level.setdefault(lv.concurrency, {})[lv.role] = lv
    spec_records = [r for lv in run.levels if lv.role == "speculative" for r in lv.records]
    method: AcceptMethod = (
        "spec_tokens_details" if run.details else "metrics" if run.counters else "server_info"
    )

    levels: list[LevelResult] = []
    for c in sorted(by_level):
        pair = by_level[c]
        if "baseline" not in pair or "speculative" not in pair:
            continue
        if run.details:
            accept = details_accept(pair["speculative"].records).accept_length
        else:
            w = run.windows.get(c)
            accept = w.accept_length() if w is not None else None
        base = level_stats(pair["baseline"])
        spec = level_stats(pair["speculative"], accept, method)
        levels.append(
            LevelResult(concurrency=c, baseline=base, speculative=spec, speedup=speedup(base, spec))
        )

    if run.details:
        overall = Acceptance(
            overall=details_accept(spec_records).accept_length, method=method, exact=True
        )
    else:
        w = _overall_window(run)
        value = w.accept_length() if w is not None else None
        overall = Acceptance(
            overall=value, method=method if value is not None else "none", exact=run.fresh
        )

    sources = _sources(run, prompts, spec_records, adapters or {})
    report = BenchReport(
        created_at=(now or _dt.datetime.now(_dt.UTC)).isoformat(timespec="seconds"),
        regen_version=regen.__version__,
        model=run.model,
        settings=settings,
        servers=dict(run.flags),
        levels=levels,
        crossover=crossover(levels),
        acceptance=overall,
        sources=sources,
        greedy=compare_greedy(run.levels, run.temperature),
    )
    report.verdicts = verdicts(report)
    return report


def _sources(
    run: BenchRun,
    prompts: Sequence[BenchPrompt],
    spec_records: list,
    adapters: Mapping[str, str],
) -> list[SourceResult]:
    names: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        names.setdefault(p.source, []).append(p)
    out = []
    for name, ps in names.items():
        kind = source_kind(name, adapters.get(name), sum(p.has_tools for p in ps) / len(ps))
        if run.details:
            d = details_accept(r for r in spec_records if r.source == name)
            out.append(
                SourceResult(
                    source=name,
                    kind=kind,
                    prompts=len(ps),
                    requests=d.requests,
                    completion_tokens=d.completion_tokens,
                    verify_ct=d.verify_ct,
                    accept_length=d.accept_length,
                    method="spec_tokens_details" if d.accept_length is not None else "none",
                )
            )
            continue
        w = run.source_windows.get(name)
        value = w.accept_length() if w is not None else None
        counted = [r for r in spec_records if r.source == name and r.ok]
        out.append(
            SourceResult(
                source=name,
                kind=kind,
                prompts=len(ps),
                requests=len(counted),
                completion_tokens=sum(r.completion_tokens or 0 for r in counted),
                accept_length=value,
                method=("metrics" if run.counters else "server_info")
                if value is not None
                else "none",
                exact=run.fresh,
            )
        )
    return out
