"""regen.devkit.loop.summary: the side-by-side table and the findings, from a loop record (pure)."""

from __future__ import annotations

from rich.console import Console

from regen.devkit.loop.record import BenchRecord, GreedyRecord, LevelRecord, LoopRecord, RoundRecord
from regen.devkit.loop.summary import findings, summary_table


def bench(accept: float, sources: dict[str, float], *, same: int = 4, verdicts=()) -> BenchRecord:
    return BenchRecord(
        bench_json="b.json", prompts=4, accept_length=accept, sources=sources,
        levels=[LevelRecord(concurrency=1, speedup=0.7, baseline_tok_s=100.0,
                            speculative_tok_s=70.0)],
        verdicts=list(verdicts),
        greedy=GreedyRecord(prompts=4, identical=same, tokens=80,
                            differing=[f"s:{i}" for i in range(4 - same)]),
    )  # fmt: skip


def round_(n: int, b: BenchRecord, samples: dict[str, int], limits=None) -> RoundRecord:
    return RoundRecord(
        round=n, run_dir=f"r{n}", limits=limits or {}, samples=samples, rows_read=10,
        rows_kept=8, held_out=2, loss=[(0, 2.0), (50, 0.5)], train_steps=50, checkpoint="c",
        draft="d", draft_vllm="d-vllm", bench=b,
    )  # fmt: skip


def record(second_same: int = 4) -> LoopRecord:
    r1 = round_(1, bench(1.8, {"chat": 3.5, "tools": 1.1}), {"chat": 9, "tools": 7})
    r2 = round_(2, bench(1.7, {"chat": 3.2, "tools": 1.2}, same=second_same),
                {"chat": 6, "tools": 7}, limits={"chat": 6, "tools": 16})  # fmt: skip
    return LoopRecord(
        created_at="now", manifest="m", train_config="t", train_steps=50, concurrency=[1],
        per_source=2, max_tokens=64, num_speculative_tokens=3, rounds=[r1, r2],
        untrained=bench(1.02, {"chat": 1.03, "tools": 1.0}, verdicts=["draft-not-used"]),
    )  # fmt: skip


def text_of(renderable) -> str:
    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


def test_the_table_puts_both_rounds_and_the_untrained_draft_side_by_side() -> None:
    lines = text_of(summary_table(record())).splitlines()
    row = {ln.split("│")[1].strip(): [c.strip() for c in ln.split("│")[2:-1]]
           for ln in lines if ln.count("│") == 5}  # fmt: skip
    assert row["acceptance length"] == ["1.80", "1.70", "1.02"]
    assert row["chat (samples)"] == ["3.50 (9)", "3.20 (6)", "1.03"]
    assert row["tools (samples)"] == ["1.10 (7)", "1.20 (7)", "1.00"]
    assert row["speedup at concurrency 1"] == ["0.70×"] * 3
    assert row["greedy answers identical"] == ["4/4"] * 3
    assert row["draft not used (verdict)"] == ["no", "no", "yes"]
    assert row["held-out loss (step 0 → last)"] == ["2.000 → 0.500"] * 2 + [""]


def test_the_findings_say_what_held_and_what_did_not() -> None:
    good = [text_of(x) for x in findings(record())]
    assert any("round 1: the trained draft's acceptance 1.80 vs 1.02" in t for t in good)
    assert any("draft not used" in t for t in good)
    # the reweight asked for 16 tools rows; the source had 7
    assert any("more of tools 7" in t and "rows ran out" in t for t in good)
    assert not any("chat 6" in t for t in good)
    bad = [text_of(x) for x in findings(record(second_same=3))]
    assert any("round 2: 1 of 4 greedy answers differ with the draft: s:0" in t for t in bad)
