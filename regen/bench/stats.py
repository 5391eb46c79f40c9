"""Numbers from request records: per-level throughput and latency, acceptance, speedup, crossover.

Definitions (pure functions, no I/O):

- **output tok/s** = server-counted completion tokens produced while all of the level's
  ``concurrency`` requests were in flight ÷ that time (:func:`steady_tokens`): the level is a
  closed loop, and once its last request is sent the batch drains, so counting the tail would
  measure how the level ends, not the server at that concurrency (a tail of a few slow
  requests can halve a short level's throughput). Each request's first token counts at its
  TTFT, the rest evenly over its decode time. **wall tok/s** = all completion tokens ÷ the
  level's wall time (first request sent → last one finished); **requests/s** = ok requests ÷
  wall time.
- **TTFT / latency p50, p95**: linear interpolation between order statistics.
- **acceptance from spec_tokens_details** = Σ decode tokens ÷ Σ ``spec_verify_ct`` over the
  requests (decode tokens: completion tokens minus the prefill's first): the mean tokens kept
  per verify step, the quantity ``/server_info``'s ``avg_spec_accept_length`` and SGLang's own
  ``bench_serving`` report. SGLang's per-request ``spec_accept_length`` (completion ÷ verify
  steps) also counts the prefill's token, which inflates short answers.
- **acceptance from /server_info**: ``avg_spec_accept_length`` is SGLang's running total
  (accepted tokens ÷ request-steps since start). Across a window (a level, or one source's
  pass) where the bench had the server produce ``T`` decode tokens (completion tokens minus the
  first, which comes from the prefill), after ``T_prev`` before it::

      F_prev = T_prev / A_before,   F_after = (T_prev + T) / A_after,   a = T / (F_after − F_prev)

  exact when the running total started with the bench (``A`` not yet reported at the start);
  otherwise earlier traffic is counted as if it were the bench's, and the value is marked
  inexact. SGLang folds its counters in every 40 decode steps: a window can lag a little, and
  bench traffic not yet folded in when ``A_before`` is read (still unreported) is taken at
  the window's own average.
- **acceptance from vLLM's /metrics** = 1 + Δ``vllm:spec_decode_num_accepted_tokens_total``
  ÷ Δ``vllm:spec_decode_num_drafts_total`` across a window (:class:`CounterWindow`): counters,
  not a running mean, so the window's own traffic is measured exactly whatever came before it.
- **speedup** = speculative ÷ baseline output tok/s per level; the **crossover** is where it
  crosses 1, interpolated linearly in log(concurrency) between the last level above 1 and the
  first at or below it.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from regen.bench.load import LevelRun, RequestRecord
from regen.bench.report import AcceptMethod, Crossover, LevelResult, LevelStats
from regen.serve.vllm import SpecCounters

#: a window's acceptance below this is inconsistent counters, not a measurement (1.0 is the
#: floor; SGLang's counter lag can pull an honest 1.0 a little below it)
MIN_PLAUSIBLE_ACCEPT = 0.95


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def decode_tokens(records: Iterable[RequestRecord]) -> int:
    """Tokens produced by decode steps: completion tokens minus the prefill's first, ok only."""
    return sum(max(r.completion_tokens - 1, 0) for r in records if r.ok and r.completion_tokens)


@dataclass(slots=True)
class DetailsAccept:
    """Acceptance pooled from per-request spec_tokens_details."""

    accept_length: float | None  #: decode tokens ÷ verify steps
    completion_tokens: int
    verify_ct: int
    requests: int


def details_accept(records: Iterable[RequestRecord]) -> DetailsAccept:
    """Σ decode tokens ÷ Σ verify steps over the ok requests that carried details."""
    tokens = verify = n = 0
    for r in records:
        if r.ok and r.verify_ct and r.completion_tokens is not None:
            tokens += r.completion_tokens
            verify += r.verify_ct
            n += 1
    decode = tokens - n  # each request's first token came from its prefill
    return DetailsAccept(decode / verify if verify else None, tokens, verify, n)


@dataclass(slots=True)
class AcceptWindow:
    """The server's running acceptance around a window of bench traffic."""

    before: float | None  #: avg_spec_accept_length before the window (None: not reported)
    after: float | None  #: after it
    tokens_before: int  #: decode tokens the bench had the server produce before the window
    tokens: int  #: decode tokens produced in the window
    fresh: bool  #: whether the running total started with the bench

    def accept_length(self) -> float | None:
        """The window's own acceptance (module docstring), None when it cannot be told."""
        if self.after is None or self.tokens <= 0:
            return None
        # not reported yet although the bench had sent traffic (SGLang folds its counters in
        # every 40 decode steps): that earlier traffic is taken at the window's own average
        f_prev = self.tokens_before / (self.before if self.before is not None else self.after)
        f_after = (self.tokens_before + self.tokens) / self.after
        steps = f_after - f_prev
        if steps <= 0:
            return None
        value = self.tokens / steps
        # below ~1 is impossible (every step keeps a token): counters that do not fit the traffic
        return value if value >= MIN_PLAUSIBLE_ACCEPT else None


@dataclass(slots=True)
class CounterWindow:
    """vLLM's speculative counters around a window of bench traffic (``before`` / ``after``:
    regen.serve.vllm.SpecCounters; None where they could not be read)."""

    before: SpecCounters | None
    after: SpecCounters | None
    fresh: bool = True  #: counters are exact whatever ran before: always True

    def accept_length(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        value = self.after.since(self.before)
        return value if value is not None and value >= MIN_PLAUSIBLE_ACCEPT else None


def steady_tokens(run: LevelRun) -> float | None:
    """Completion tokens the ok requests produced within ``[0, run.full_s]`` (module
    docstring); None when the level does not know that window."""
    end = run.full_s
    if end is None or end <= 0:
        return None
    total = 0.0
    for r in run.records:
        n = r.completion_tokens
        if not r.ok or not n or r.sent_s is None or r.latency_s is None:
            continue
        last = r.sent_s + r.latency_s
        first = r.sent_s + r.ttft_s if r.ttft_s is not None else last
        if first <= end:
            total += 1
        if n > 1 and last > first:
            total += (n - 1) * max(0.0, min(last, end) - first) / (last - first)
        elif n > 1 and last <= end:
            total += n - 1
    return total


def level_stats(
    run: LevelRun, accept: float | None = None, method: AcceptMethod = "none"
) -> LevelStats:
    """The stats of one server at one level."""
    ok = [r for r in run.records if r.ok]
    errors = Counter(r.error or "unknown" for r in run.records if not r.ok)
    tokens = sum(r.completion_tokens or 0 for r in ok)
    wall = run.wall_s
    steady = steady_tokens(run)
    if steady is not None and run.full_s:
        tok_s, window = steady / run.full_s, run.full_s
    else:
        tok_s, window = (tokens / wall if wall > 0 else 0.0), None
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    lats = [r.latency_s for r in ok if r.latency_s is not None]
    speeds = [s for s in (r.decode_tok_s for r in ok) if s is not None]
    return LevelStats(
        requests=len(run.records),
        ok=len(ok),
        errors=dict(sorted(errors.items())),
        wall_s=wall,
        completion_tokens=tokens,
        output_tok_s=tok_s,
        full_s=window,
        wall_tok_s=tokens / wall if wall > 0 else 0.0,
        requests_per_s=len(ok) / wall if wall > 0 else 0.0,
        ttft_p50_s=percentile(ttfts, 0.5),
        ttft_p95_s=percentile(ttfts, 0.95),
        latency_p50_s=percentile(lats, 0.5),
        latency_p95_s=percentile(lats, 0.95),
        decode_tok_s_p50=percentile(speeds, 0.5),
        accept_length=accept,
        accept_method=method if accept is not None else "none",
    )


def speedup(baseline: LevelStats, speculative: LevelStats) -> float | None:
    """Speculative ÷ baseline output tok/s (None when either produced nothing)."""
    if baseline.output_tok_s <= 0 or speculative.output_tok_s <= 0:
        return None
    return speculative.output_tok_s / baseline.output_tok_s


def crossover(levels: Sequence[LevelResult]) -> Crossover:
    """Where the speedup first falls to 1 or below after paying (levels in ascending order)."""
    measured = [(lv.concurrency, lv.speedup) for lv in levels if lv.speedup is not None]
    for (c0, s0), (c1, s1) in itertools.pairwise(measured):
        if s0 > 1.0 >= s1:
            if s0 == s1:
                at = float(c0)
            else:
                frac = (s0 - 1.0) / (s0 - s1)
                at = math.exp(math.log(c0) + frac * (math.log(c1) - math.log(c0)))
            return Crossover(concurrency=at, last_paying=c0, first_losing=c1)
    return Crossover()
