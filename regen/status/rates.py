"""Rates and the ETA of a run, from its token series and its sources' numbers.

- rates: completion tokens per second over the last 1, 5 and 15 minutes of ``token_series``,
  ending at its last point (shorter when the session is younger; ``span_s`` says how long);
- ETA: remaining samples per source (total - done - failed) x observed completion tokens per
  sample of that source (when it has none yet: manifest ``output_tokens`` per TURN x expected
  turns per sample = the plan's ``regenerate_turns / regenerate_todo``, else 1 when the
  manifest says ``turns: last``, else 1 — a labelled underestimate for multi-turn sources),
  divided by the recent rate (5 min, else 15, else 1). The band combines the spread of the
  three rates with the uncertainty of each source's mean length (coefficient of variation from
  ``output_tokens_hist`` / sqrt(turns seen), two sigma, capped at 50 %).

Pure functions; owns no files.
"""

from __future__ import annotations

import math

from regen.status.records import Eta, Rate, SourceNumbers

#: the rate windows, seconds
RATE_WINDOWS_S = (60.0, 300.0, 900.0)
#: a rate needs at least this much series span
MIN_RATE_SPAN_S = 10.0
#: planning assumption (output tokens per turn) when the manifest does not say
DEFAULT_OUTPUT_TOKENS = (600, 1400)
#: two-sigma band on a source's mean length, never wider than this fraction
MAX_LENGTH_REL = 0.5


def window_rate(series: list[tuple[float, int]], window_s: float) -> Rate:
    """Tokens/s over the last ``window_s`` of the series (linear between points)."""
    if len(series) < 2:
        return Rate(window_s, None, 0.0)
    t_end, v_end = series[-1]
    t0 = max(t_end - window_s, series[0][0])
    span = t_end - t0
    if span < MIN_RATE_SPAN_S:
        return Rate(window_s, None, span)
    return Rate(window_s, max(0.0, (v_end - _value_at(series, t0)) / span), span)


def _value_at(series: list[tuple[float, int]], t: float) -> float:
    prev_t, prev_v = series[0]
    if t <= prev_t:
        return float(prev_v)
    for cur_t, cur_v in series[1:]:
        if cur_t >= t:
            if cur_t == prev_t:
                return float(cur_v)
            return prev_v + (cur_v - prev_v) * (t - prev_t) / (cur_t - prev_t)
        prev_t, prev_v = cur_t, cur_v
    return float(prev_v)


def last_growth_at(series: list[tuple[float, int]]) -> float | None:
    """The time of the last series point whose value grew (the first point when none grew)."""
    if not series:
        return None
    for (_, v0), (t1, v1) in zip(reversed(series[:-1]), reversed(series[1:]), strict=True):
        if v1 > v0:
            return t1
    return series[0][0]


def length_cv(edges: list[int], counts: list[int]) -> float:
    """Coefficient of variation of the output lengths in the histogram (1.0 with no data)."""
    n = sum(counts)
    if n == 0:
        return 1.0
    mids = []
    for i in range(len(counts)):
        lo = edges[i]
        hi = edges[i + 1] if i + 1 < len(edges) else lo * 1.5 or 1
        mids.append((lo + hi) / 2)
    mean = sum(m * c for m, c in zip(mids, counts, strict=True)) / n
    if mean <= 0:
        return 1.0
    var = sum(c * (m - mean) ** 2 for m, c in zip(mids, counts, strict=True)) / n
    return math.sqrt(var) / mean


def estimate_eta(
    sources: list[SourceNumbers],
    rates: list[Rate],
    assumptions: dict[str, tuple[int, int]],
    cv: float,
    turns: dict[str, float] | None = None,
) -> Eta | None:
    """Remaining tokens (with a band) over the recent rate (with a band); None without a rate.

    ``assumptions`` are output tokens per regenerated TURN; ``turns`` the expected turns per
    sample (1 for sources not listed).
    """
    tok = tok_lo = tok_hi = 0.0
    assumed = []
    for s in sources:
        if not s.regenerate or s.remaining == 0:
            continue
        if s.tokens_per_sample is not None and s.rows > 0:
            rel = min(MAX_LENGTH_REL, 2.0 * cv / math.sqrt(s.rows))
            mid = s.tokens_per_sample
            lo, hi = mid * (1 - rel), mid * (1 + rel)
        else:
            per_turn = assumptions.get(s.name, DEFAULT_OUTPUT_TOKENS)
            k = (turns or {}).get(s.name, 1.0)
            lo, hi = per_turn[0] * k, per_turn[1] * k
            mid = (lo + hi) / 2
            assumed.append(s.name)
        tok += s.remaining * mid
        tok_lo += s.remaining * lo
        tok_hi += s.remaining * hi
    by_window = {r.window_s: r.tok_s for r in rates if r.tok_s}
    if tok == 0:
        rate = by_window.get(300.0) or next(iter(by_window.values()), 0.0)
        return Eta(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, rate or 0.0, assumed)
    if not by_window:
        return None
    rate = by_window.get(300.0) or by_window.get(900.0) or by_window[min(by_window)]
    r_lo, r_hi = min(by_window.values()), max(by_window.values())
    return Eta(
        seconds=tok / rate,
        low_s=tok_lo / r_hi,
        high_s=tok_hi / r_lo,
        tokens=tok,
        tokens_low=tok_lo,
        tokens_high=tok_hi,
        rate_tok_s=rate,
        assumed_sources=assumed,
    )
