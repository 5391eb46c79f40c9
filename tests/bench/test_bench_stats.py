"""regen.bench.stats: percentiles, level stats, acceptance (per request and from /server_info
windows), speedup and the crossover."""

from __future__ import annotations

import math

import pytest
from _bench_common import stats

from regen.bench.load import LevelRun, RequestRecord, level_size
from regen.bench.report import LevelResult
from regen.bench.stats import (
    AcceptWindow,
    crossover,
    decode_tokens,
    details_accept,
    level_stats,
    percentile,
    speedup,
    steady_tokens,
)
from regen.devkit.simulate.speculative import SpecCounters, SpecRequest, SpeedModel


def rec(**kw) -> RequestRecord:
    base = {"role": "speculative", "concurrency": 4, "source": "s", "sample_id": "s:0", "ok": True}
    return RequestRecord(**{**base, **kw})


def test_percentile_interpolates() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert percentile(list(range(101)), 0.95) == pytest.approx(95.0)
    assert percentile([1.0, 2.0], 0.95) == pytest.approx(1.95)


def test_level_stats_from_records() -> None:
    records = [
        rec(ttft_s=0.1 * (i + 1), latency_s=1.0 + i, completion_tokens=101) for i in range(4)
    ]
    records.append(rec(ok=False, error="server_error", status=503, latency_s=0.01))
    records.append(rec(ok=False, error="no_usage", latency_s=0.5))
    st = level_stats(LevelRun("speculative", 4, wall_s=5.0, records=records), 2.4, "server_info")
    assert (st.requests, st.ok) == (6, 4)
    assert st.errors == {"no_usage": 1, "server_error": 1}
    assert st.completion_tokens == 404
    assert st.output_tok_s == pytest.approx(404 / 5.0)
    assert st.requests_per_s == pytest.approx(4 / 5.0)
    assert st.ttft_p50_s == pytest.approx(0.25)
    assert st.latency_p50_s == pytest.approx(2.5)
    assert st.latency_p95_s == pytest.approx(3.85)
    # decode speed: 100 tokens after the first, over latency − ttft
    assert st.decode_tok_s_p50 == pytest.approx(
        percentile([100 / 0.9, 100 / 1.8, 100 / 2.7, 100 / 3.6], 0.5)
    )
    assert (st.accept_length, st.accept_method) == (2.4, "server_info")
    empty = level_stats(LevelRun("baseline", 1, wall_s=0.0, records=[]))
    assert empty.output_tok_s == 0 and empty.ttft_p50_s is None and empty.accept_method == "none"


def test_throughput_counts_only_while_the_level_was_full() -> None:
    """Two workers: one did two short requests, the other one long one; the first ran out of
    work at 4 s, so the last 6 s (one request draining alone) are left out."""
    records = [
        rec(sent_s=0.0, ttft_s=1.0, latency_s=2.0, completion_tokens=11),  # all inside
        rec(sent_s=2.0, ttft_s=1.0, latency_s=2.0, completion_tokens=11),  # all inside
        # first token at 1 s, 100 more evenly over 1..10 s: 1 + 100 × 3/9 before 4 s
        rec(sent_s=0.0, ttft_s=1.0, latency_s=10.0, completion_tokens=101),
        rec(ok=False, error="timeout", sent_s=0.5, latency_s=1.0),
    ]
    lv = LevelRun("baseline", 2, wall_s=10.0, records=records, full_s=4.0)
    assert steady_tokens(lv) == pytest.approx(11 + 11 + 1 + 100 / 3)
    st = level_stats(lv)
    assert st.full_s == 4.0
    assert st.output_tok_s == pytest.approx((22 + 1 + 100 / 3) / 4.0)
    assert st.wall_tok_s == pytest.approx(123 / 10.0)  # the whole level, drain included
    assert st.requests_per_s == pytest.approx(3 / 10.0)
    # a first token after the window, or no first token at all (an empty answer)
    late = rec(sent_s=3.0, ttft_s=2.0, latency_s=3.0, completion_tokens=5)
    silent = rec(sent_s=1.0, ttft_s=None, latency_s=2.0, completion_tokens=1)
    assert steady_tokens(LevelRun("b", 2, 10.0, [late, silent], full_s=4.0)) == 1
    # one worker: it runs out of work when the level ends, the window is the whole level
    seq = [rec(sent_s=2.0 * i, ttft_s=0.5, latency_s=2.0, completion_tokens=20) for i in range(3)]
    one = level_stats(LevelRun("b", 1, wall_s=6.0, records=seq, full_s=6.0))
    assert one.output_tok_s == pytest.approx(one.wall_tok_s) == pytest.approx(10.0)
    # a level without the window (built by hand) falls back to the wall time
    assert steady_tokens(LevelRun("b", 2, 10.0, records)) is None
    assert level_stats(LevelRun("b", 2, 10.0, records)).output_tok_s == pytest.approx(12.3)


def test_decode_speed_needs_two_tokens_and_a_first_token() -> None:
    assert rec(completion_tokens=1, ttft_s=0.1, latency_s=1.0).decode_tok_s is None
    assert rec(completion_tokens=10, ttft_s=None, latency_s=1.0).decode_tok_s is None
    assert rec(completion_tokens=10, ttft_s=1.0, latency_s=1.0).decode_tok_s is None
    assert rec(completion_tokens=10, ttft_s=0.1, latency_s=1.0).decode_tok_s == pytest.approx(10.0)


def test_details_pool_tokens_over_verify_steps() -> None:
    records = [
        rec(completion_tokens=100, verify_ct=40),
        rec(completion_tokens=50, verify_ct=50),
        rec(completion_tokens=70, verify_ct=None),  # a server without details: not counted
        rec(ok=False, completion_tokens=None, verify_ct=None, error="timeout"),
    ]
    d = details_accept(records)
    assert d.accept_length == pytest.approx((99 + 49) / 90)  # the prefill's tokens left out
    assert (d.completion_tokens, d.verify_ct, d.requests) == (150, 90, 2)
    assert details_accept([]).accept_length is None


def test_decode_tokens_leave_out_the_prefill_token() -> None:
    records = [rec(completion_tokens=10), rec(completion_tokens=1), rec(ok=False, error="x")]
    assert decode_tokens(records) == 9


def _server_windows(accepts: list[float], tokens: list[int], *, before_bench: tuple[int, int]):
    """A server's running total (SpecCounters) around windows of bench traffic; returns the
    AcceptWindows the bench would record."""
    counters = SpecCounters()
    counters.add(*before_bench)
    fresh = counters.avg_accept_length is None
    windows = []
    sent = 0
    for a, t in zip(accepts, tokens, strict=True):
        before = counters.avg_accept_length
        r = SpecRequest(a, cap=8)
        left = t
        while left:
            n = r.step(left)
            left -= n
            counters.add(n)
        windows.append(AcceptWindow(before, counters.avg_accept_length, sent, t, fresh))
        sent += t
    return windows


def test_server_info_windows_are_exact_on_a_fresh_server() -> None:
    accepts = [2.6, 1.4, 3.1]
    windows = _server_windows(accepts, [5200, 2800, 6200], before_bench=(0, 0))
    for w, a in zip(windows, accepts, strict=True):
        assert w.fresh
        assert w.accept_length() == pytest.approx(a, rel=1e-3)


def test_server_info_windows_are_approximate_after_earlier_traffic() -> None:
    """Traffic before the bench (here 10,000 request-steps at 1.0) is counted as if it were
    the bench's: the windows come out wrong, which is why they are flagged inexact."""
    accepts = [2.6, 1.4, 3.1]
    windows = _server_windows(accepts, [5200, 2800, 6200], before_bench=(10_000, 10_000))
    assert not any(w.fresh for w in windows)
    assert any(abs(w.accept_length() - a) / a > 0.05 for w, a in zip(windows, accepts, strict=True))


def test_server_info_window_edges() -> None:
    assert AcceptWindow(2.1, 2.1, 500, 1000, False).accept_length() == pytest.approx(2.1)
    assert AcceptWindow(None, None, 0, 1000, True).accept_length() is None  # never reported
    assert AcceptWindow(2.0, 2.0, 0, 0, True).accept_length() is None  # no traffic
    # the warm-up's tokens not folded in yet: taken at the window's average
    assert AcceptWindow(None, 2.0, 100, 1000, True).accept_length() == pytest.approx(2.0)
    assert AcceptWindow(3.0, 1.0, 3000, 10, True).accept_length() is None  # impossible numbers


def test_speedup_and_crossover() -> None:
    assert speedup(stats(100.0), stats(160.0)) == pytest.approx(1.6)
    assert speedup(stats(0.0), stats(160.0)) is None
    assert speedup(stats(100.0), stats(0.0)) is None

    def lv(c: int, s: float | None) -> LevelResult:
        return LevelResult(concurrency=c, baseline=stats(100), speculative=stats(100), speedup=s)

    cross = crossover([lv(1, 1.6), lv(4, 1.4), lv(16, 1.1), lv(64, 0.91)])
    assert (cross.last_paying, cross.first_losing) == (16, 64)
    frac = (1.1 - 1.0) / (1.1 - 0.91)
    assert cross.concurrency == pytest.approx(math.exp(math.log(16) + frac * math.log(4)))
    assert 16 < cross.concurrency < 64
    assert crossover([lv(1, 1.6), lv(64, 1.2)]).concurrency is None  # pays everywhere
    assert crossover([lv(1, 0.9), lv(64, 0.8)]).concurrency is None  # never pays
    assert crossover([lv(1, 1.2), lv(4, None), lv(16, 1.0)]).first_losing == 16
    assert crossover([]).concurrency is None


def test_crossover_of_the_speed_model_curve() -> None:
    """Speedups drawn from the model's closed form cross where the model says (log-linear
    interpolation between measured levels lands within one level's gap of it)."""
    m = SpeedModel()
    levels = [1, 2, 4, 8, 16, 32, 64, 128]
    results = [
        LevelResult(
            concurrency=c, baseline=stats(100), speculative=stats(100), speedup=m.speedup(2.1, c)
        )
        for c in levels
    ]
    cross = crossover(results)
    assert cross.last_paying <= m.crossover(2.1) <= cross.first_losing
    assert cross.concurrency == pytest.approx(m.crossover(2.1), rel=0.1)


def test_level_size_fills_the_batch() -> None:
    assert level_size(60, 1) == 60
    assert level_size(60, 64) == 128
    assert level_size(3, 4) == 8
