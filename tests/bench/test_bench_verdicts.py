"""regen.bench.verdicts: the issue's three examples and the other findings, from chosen numbers."""

from __future__ import annotations

from _bench_common import report

from regen.bench.report import LevelStats, ServerFlags
from regen.bench.verdicts import source_kind, verdicts

REFERENCE = {1: (90.0, 144.0), 4: (340.0, 480.0), 16: (1200.0, 1250.0), 64: (4000.0, 3640.0)}
MIX = {"sharegpt": 2.6, "ultrachat": 2.6, "xlam": 1.4, "magicoder": 2.6}


def codes(rep) -> list[str]:
    return [v.code for v in rep.verdicts]


def texts(rep, code: str) -> list[str]:
    return [v.text for v in rep.verdicts if v.code == code]


def test_speedup_headline_says_where_to_serve_it() -> None:
    rep = report(REFERENCE, {"sharegpt": 2.1})
    [text] = texts(rep, "speedup")
    assert text.startswith("EAGLE3 draft: 1.60× at concurrency 1, 0.91× at 64: serve it at ")
    assert "concurrency ≤ 16" in text
    assert f"near {rep.crossover.concurrency:.0f}" in text
    assert 16 < rep.crossover.concurrency < 64


def test_draft_not_used_asks_about_eagle() -> None:
    rep = report({1: (90, 70), 64: (4000, 1900)}, {"sharegpt": 1.0, "xlam": 1.0}, algorithm="EAGLE")
    [text] = texts(rep, "draft-not-used")
    assert text.startswith(
        "acceptance 1.00 ≤ 1.1: the draft is not being used. "
        "Is the algorithm EAGLE instead of EAGLE3?"
    )
    assert "The server runs EAGLE: restart it with --speculative-algorithm EAGLE3." in text
    assert [v.severity for v in rep.verdicts if v.code == "draft-not-used"] == ["problem"]
    assert "source-low" not in codes(rep)  # per-source numbers mean nothing then
    # the same numbers on a server that does run EAGLE3 point at the draft instead
    rep3 = report({1: (90, 70)}, {"sharegpt": 1.05}, algorithm="EAGLE3")
    [text3] = texts(rep3, "draft-not-used")
    assert "does run EAGLE3" in text3 and "aux layer ids" in text3


def test_low_source_names_its_kind() -> None:
    rep = report(REFERENCE, MIX)
    [text] = texts(rep, "source-low")
    assert text.startswith(
        "acceptance on xlam 1.4 vs 2.6 elsewhere: tool-calling data is under-represented"
    )
    assert "--reweight" in text


def test_low_source_needs_a_real_gap() -> None:
    close = report(REFERENCE, {"a": 2.0, "b": 2.2, "c": 2.1})
    assert "source-low" not in codes(close)
    # exactly at 80% of the others is low
    edge = report(REFERENCE, {"a": 1.04, "b": 1.3, "c": 1.3})
    assert texts(edge, "source-low")[0].startswith("acceptance on a 1.0 vs 1.3 elsewhere")
    # two low sources are both named
    two = report(
        REFERENCE,
        {"xlam": 1.3, "glaive": 1.35, "sharegpt": 2.8, "ultrachat": 2.7, "magicoder": 2.9},
    )
    assert len(texts(two, "source-low")) == 2


def test_always_faster_never_faster_and_no_difference() -> None:
    good = report({1: (90, 160), 64: (4000, 4600)}, {"s": 2.6})
    assert [v.severity for v in good.verdicts if v.code == "speedup"] == ["good"]
    assert "faster at every measured level" in texts(good, "speedup")[0]
    bad = report({1: (90, 85), 64: (4000, 3000)}, {"s": 1.6})
    assert "never faster than the baseline; do not serve it" in texts(bad, "speedup")[0]
    assert "verify-cost" in codes(bad)  # accepted, yet slower even at concurrency 1
    same = report({1: (90, 91), 4: (340, 338)}, {"s": 2.1})
    assert "no measurable difference" in texts(same, "speedup")[0]
    assert "verify-cost" not in codes(same)


def test_flags_problems_come_first() -> None:
    rep = report(REFERENCE, MIX, algorithm="EAGLE")
    rep.servers["speculative"].trap = "eagle-vs-eagle3"
    rep.servers["speculative"].problem = "[eagle-vs-eagle3] ... Fix: EAGLE3"
    rep.servers["baseline"] = ServerFlags(
        role="baseline",
        url="http://b/v1",
        algorithm="EAGLE3",
        trap="baseline-speculates",
        problem="runs EAGLE3",
    )
    found = verdicts(rep)
    assert [v.code for v in found[:2]] == ["eagle-vs-eagle3", "baseline-speculates"]
    assert found[0].text.startswith("speculative server: [eagle-vs-eagle3]")


def test_batch_limit_failures_ttft_and_acceptance_source() -> None:
    rep = report(REFERENCE, MIX, max_running=48, method="server_info")
    assert texts(rep, "batch-limit")[0].startswith(
        "concurrency 64 exceeds the baseline server's 48 batch slots"
    )
    assert "avg_spec_accept_length" in texts(rep, "acceptance-source")[0]
    rep.acceptance.exact = False
    lv = rep.levels[0]
    lv.speculative = LevelStats(
        **{
            **lv.speculative.model_dump(),
            "ok": 37,
            "errors": {"server_error": 3},
            "ttft_p50_s": 0.2,
        }
    )
    again = verdicts(rep)
    fail = [v.text for v in again if v.code == "failures"]
    assert fail == ["speculative server: 3 of 160 requests failed (server_error 3)"]
    assert [v.text for v in again if v.code == "ttft"] == [
        "time to first token at concurrency 1: 200 ms speculative vs 50 ms baseline (4.0×)"
    ]
    assert "approximate" in next(v.text for v in again if v.code == "acceptance-source")
    none = report(REFERENCE, {"s": None})
    assert texts(none, "acceptance-source")[0].startswith("no acceptance length")


def test_no_levels_is_a_problem() -> None:
    rep = report({1: (0.0, 0.0)}, {"s": 2.0})
    assert [(v.severity, v.text) for v in rep.verdicts if v.code == "speedup"] == [
        ("problem", "no level produced tokens on both servers")
    ]


def test_source_kinds() -> None:
    assert source_kind("xlam") == "tool-calling"
    assert source_kind("my_tools", adapter="glaive") == "tool-calling"
    assert source_kind("mine", tool_share=0.8) == "tool-calling"
    assert source_kind("mine", tool_share=0.2) == "general"
    assert source_kind("magicoder") == "code"
    assert source_kind("openthoughts") == "reasoning"
