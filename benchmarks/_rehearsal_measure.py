"""The rehearsal's measurements, computed after the run from what was sampled (issue 32).

- **Utilization** (benchmarks/utilization.py's definition: server tokens ÷ (capacity × wall),
  every client's tokens, from each server's own ``/stats``): end to end per endpoint and for
  the fleet, from the first request received to the last one finished; and steady state per
  endpoint over ``BIN_S``-second bins from ``WARMUP_S`` after the first request to the end of
  the backlog (the moment the last conversation first reached a server, from the request
  logs), leaving out every bin a disturbance touches (a fault on that endpoint, or a fault of
  the whole run: the driver down, the disk full, an actor killed), each with
  ``RECOVERY_S`` after it.
- **Cost of a fault**: over its window (start to end plus ``RECOVERY_S``), the tokens the
  fleet did not make against each endpoint's steady-state rate, in seconds of the whole
  fleet; the requests cut on its endpoint; the answers thrown away (completed but not stored,
  or completed again) whose first completion falls in the minute before it.
- **Memory**: RSS of each driver session and of the actors against the run's progress.
- **CPU**: by group over windows (:class:`benchmarks._proctree.TreeSampler`).

Owns no files.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from benchmarks._rehearsal_fleet import Endpoint, Reading

BIN_S = 10.0
WARMUP_S = 20.0
RECOVERY_S = 30.0


class Series:
    """Cumulative counters of every endpoint incarnation, read at any time (linear between
    readings; an incarnation counts 0 before its first reading, its last value after)."""

    def __init__(self, readings: Iterable[Reading]) -> None:
        Row = tuple[list[float], list[int], list[int], list[int], list[int]]
        self.by: dict[tuple[int, int], Row] = {}
        for r in readings:
            key = (r.endpoint, r.incarnation)
            ts, tok, bg, done, got = self.by.setdefault(key, ([], [], [], [], []))
            ts.append(r.t)
            tok.append(r.tokens)
            bg.append(r.background_tokens)
            done.append(r.completed)
            got.append(r.received)

    @staticmethod
    def _at(ts: list[float], vs: list[int], t: float) -> float:
        if not ts or t <= ts[0]:
            return 0.0 if not ts or t < ts[0] else float(vs[0])
        i = bisect.bisect_right(ts, t)
        if i >= len(ts):
            return float(vs[-1])
        a, b = ts[i - 1], ts[i]
        return vs[i - 1] + (vs[i] - vs[i - 1]) * (t - a) / (b - a) if b > a else float(vs[i])

    def tokens(self, ep: int, t0: float, t1: float, *, background: bool = False) -> float:
        out = 0.0
        for (e, _), (ts, tok, bg, _d, _r) in self.by.items():
            if e == ep:
                vs = bg if background else tok
                out += self._at(ts, vs, t1) - self._at(ts, vs, t0)
        return out

    def completed(self, t: float) -> float:
        return sum(self._at(ts, d, t) for ts, _, _, d, _ in self.by.values())

    def received(self, t0: float, t1: float) -> float:
        """Requests the servers received over ``[t0, t1]`` (every incarnation)."""
        return sum(self._at(ts, r, t1) - self._at(ts, r, t0) for ts, _, _, _, r in self.by.values())


@dataclass(slots=True)
class Disturbance:
    start: float
    end: float
    endpoints: frozenset[int] | None  #: None: the whole fleet
    name: str


def utilization(
    eps: list[Endpoint],
    series: Series,
    first: float,
    last: float,
    backlog_end: float,
    disturbances: list[Disturbance],
) -> dict[str, Any]:
    """End-to-end and steady-state utilization per endpoint and for the fleet.

    ``steady``: the bins no disturbance of that endpoint or of the whole fleet touches (a
    fault on another endpoint may still cost this one: that cost is in it); ``between``:
    the bins no fault window touches at all (regen with nothing going wrong)."""
    out: dict[str, Any] = {"first_request_s": first, "last_finish_s": last,
                           "backlog_end": backlog_end, "endpoints": {}}  # fmt: skip
    wall = max(1e-9, last - first)
    total_tok = total_cap = 0.0
    acc = {"steady": [0.0, 0.0], "between": [0.0, 0.0]}
    lo, hi = first + WARMUP_S, backlog_end
    edges = []
    t = lo
    while t + BIN_S <= hi:
        edges.append((t, t + BIN_S))
        t += BIN_S
    for ep in eps:
        cap = ep.capacity_tok_s
        tok = series.tokens(ep.index, first, last)
        total_tok += tok
        total_cap += cap
        kept = {"steady": [0.0, 0.0, []], "between": [0.0, 0.0, []]}  # seconds, tokens, bins
        bins = []
        for a, b in edges:
            touched = [d for d in disturbances if d.start < b and d.end > a]
            mine = any(d.endpoints is None or ep.index in d.endpoints for d in touched)
            any_ = bool(touched)
            got = series.tokens(ep.index, a, b)
            u = got / (cap * (b - a))
            bins.append([round(a - first, 1), round(u, 3), int(mine) + int(any_)])
            for name, hit in (("steady", mine), ("between", any_)):
                if not hit:
                    k = kept[name]
                    k[0] += b - a
                    k[1] += got
                    k[2].append(u)
        row: dict[str, Any] = {
            "capacity_tok_s": cap,
            "tokens": round(tok),
            "background_tokens": round(series.tokens(ep.index, first, last, background=True)),
            "e2e": tok / (cap * wall),
        }
        for name, (secs, got, us) in kept.items():
            row[name] = got / (cap * secs) if secs else None
            row[f"{name}_s"] = secs
            row[f"{name}_min_bin"] = min(us) if us else None
            if secs:
                acc[name][0] += got
                acc[name][1] += cap * secs
        row["bins"] = bins  # [seconds after the first request, utilization, 0/1/2 touched]
        out["endpoints"][ep.index] = row
    out["fleet_e2e"] = total_tok / (total_cap * wall)
    for name, (got, cs) in acc.items():
        out[f"fleet_{name}"] = got / cs if cs else None
    out["fleet_capacity_tok_s"] = total_cap
    out["tokens"] = round(total_tok)
    out["wall_s"] = wall
    return out


def fault_cost(
    eps: list[Endpoint],
    series: Series,
    steady: dict[int, float | None],
    start: float,
    end: float,
) -> float:
    """Seconds of the whole fleet lost over ``[start, end]`` against the steady rates."""
    lost = cap_all = 0.0
    for ep in eps:
        cap = ep.capacity_tok_s
        cap_all += cap
        rate = (steady.get(ep.index) or 1.0) * cap
        lost += rate * (end - start) - series.tokens(ep.index, start, end)
    return lost / cap_all if cap_all else 0.0


def rss_at_progress(
    times: list[float], rss: list[int], progress: Callable[[float], float], marks: Iterable[float]
) -> dict[str, float]:
    """RSS (MB) of a process at its first sample where the run's progress (``progress(t)``:
    the share of samples done) reached each mark."""
    out: dict[str, float] = {}
    start = progress(times[0]) if times else 0.0
    marks = sorted(m for m in marks if m > start)  # the marks passed before it started: none
    j = 0
    for t, r in zip(times, rss, strict=True):
        p = progress(t)
        while j < len(marks) and p >= marks[j]:
            out[f"{marks[j]:.2f}"] = round(r / 2**20, 1)
            j += 1
    return out
