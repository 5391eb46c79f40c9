"""The loop's summary: every round side by side (rows, loss, acceptance per source, speedup per
concurrency, greedy answers), the never-trained draft beside them, and the findings in words.
Pure: a :class:`regen.devkit.loop.record.LoopRecord` in, rich tables and lines out."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from regen.devkit.loop.record import BenchRecord, LoopRecord
from regen.serve.sglang import LOW_ACCEPT_LENGTH


def _f(value: float | None, fmt: str = "{:.2f}") -> str:
    return "—" if value is None else fmt.format(value)


def columns(rec: LoopRecord) -> list[tuple[str, BenchRecord]]:
    """(heading, bench) per column: each round's trained draft, then the untrained one."""
    cols = [(f"round {r.round}", r.bench) for r in rec.rounds]
    if rec.untrained is not None:
        cols.append(("untrained", rec.untrained))
    return cols


def summary_table(rec: LoopRecord) -> Table:
    cols = columns(rec)
    t = Table(title="regen demo --loop: the rounds side by side", title_justify="left")
    t.add_column("")
    for head, _ in cols:
        t.add_column(head, justify="right")
    blank = [""] * (len(cols) - len(rec.rounds))

    def row(label: str, values: list[str]) -> None:
        t.add_row(label, *values)

    row("rows read / kept / held out",
        [f"{r.rows_read} / {r.rows_kept} / {r.held_out}" for r in rec.rounds] + blank)  # fmt: skip
    row("samples (regenerated + native)", [str(sum(r.samples.values())) for r in rec.rounds]
        + blank)  # fmt: skip
    row("held-out loss (step 0 → last)",
        [f"{r.loss[0][1]:.3f} → {r.loss[-1][1]:.3f}" if r.loss else "—" for r in rec.rounds]
        + blank)  # fmt: skip
    row("acceptance length", [_f(b.accept_length) for _, b in cols])
    sources = sorted({s for _, b in cols for s in b.sources})
    for s in sources:  # acceptance, and the round's samples of the source
        row(f"  {s} (samples)",
            [f"{_f(r.bench.sources.get(s))} ({r.samples.get(s, 0)})" for r in rec.rounds]
            + [_f(b.sources.get(s)) for _, b in cols[len(rec.rounds):]])  # fmt: skip
    levels = sorted({lv.concurrency for _, b in cols for lv in b.levels})
    for c in levels:
        row(f"speedup at concurrency {c}",
            [_f(next((lv.speedup for lv in b.levels if lv.concurrency == c), None), "{:.2f}×")
             for _, b in cols])  # fmt: skip
    row("greedy answers identical",
        [f"{b.greedy.identical}/{b.greedy.prompts}" for _, b in cols])  # fmt: skip
    row("draft not used (verdict)",
        ["yes" if "draft-not-used" in b.verdicts else "no" for _, b in cols])  # fmt: skip
    return t


def findings(rec: LoopRecord) -> list[str]:
    """The loop's conclusions in words (rich markup)."""
    out = []
    for head, b in columns(rec):
        g = b.greedy
        if g.identical == g.prompts:
            out.append(f"[green]✓[/] {head}: greedy answers identical with and without the draft "
                       f"({g.prompts} prompts, {g.tokens} tokens)")  # fmt: skip
        else:
            out.append(f"[red]✗[/] {head}: {g.prompts - g.identical} of {g.prompts} greedy answers "
                       f"differ with the draft: {', '.join(g.differing)}")  # fmt: skip
    untrained = rec.untrained.accept_length if rec.untrained is not None else None
    for r in rec.rounds:
        a = r.bench.accept_length
        if a is None:
            out.append(f"[red]✗[/] round {r.round}: no acceptance measured")
        elif untrained is not None:
            mark = "[green]✓[/]" if a > untrained and a > LOW_ACCEPT_LENGTH else "[red]✗[/]"
            out.append(f"{mark} round {r.round}: the trained draft's acceptance {a:.2f} vs "
                       f"{untrained:.2f} never trained ({a - untrained:+.2f})")  # fmt: skip
    for r in rec.rounds:
        short = [
            f"{k} {r.samples.get(k, 0)}" for k, v in r.limits.items() if v > r.samples.get(k, 0)
        ]
        if short:
            out.append(f"! round {r.round}: the reweight asked for more of {', '.join(short)}, but "
                       "their rows ran out: more data of that kind is what would help")  # fmt: skip
    if rec.untrained is not None and "draft-not-used" in rec.untrained.verdicts:
        out.append("[green]✓[/] the never-trained draft gets the bench's 'draft not used' verdict")
    out.append(
        "· acceptance from vLLM's own counters (1 + accepted / drafts); speedups on this CPU "
        "are not a serving prediction: the draft's forward costs about what the target's does"
    )
    return out


def print_summary(rec: LoopRecord, console: Any) -> None:
    console.print(summary_table(rec))
    for line in findings(rec):
        console.print(line, highlight=False, soft_wrap=True)
    if rec.wall_s is not None:
        console.print(f"loop wall time {rec.wall_s / 60:.1f} min", highlight=False)
