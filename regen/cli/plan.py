"""`regen plan MANIFEST`: read every source and show counts, rejects, tokens and the time band;
with ``--reweight bench.json``, the next round's per-source limits (regen.bench.reweight)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from regen.cli._args import add_override_argument

if TYPE_CHECKING:
    from regen.plan.report import PlanReport

NAME = "plan"
HELP = (
    "read every source; show per-source counts, rejects, duplicates and near-duplicates, tokens "
    "and the time band"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifest", help="manifest YAML file")
    parser.add_argument(
        "--tok-per-s",
        type=float,
        default=830.0,
        help="output throughput of the whole job, tokens/s (default 830)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_override_argument(parser)
    rw = parser.add_argument_group("data-mix feedback (docs/bench.md)")
    rw.add_argument(
        "--reweight",
        metavar="BENCH_JSON",
        help="propose per-source limits for the next round from a regen bench result: more "
        "where acceptance is low; written as an overlay YAML for -o",
    )
    rw.add_argument(
        "--budget",
        type=int,
        default=None,
        metavar="N",
        help="total samples of the proposal (default: the current total)",
    )
    rw.add_argument(
        "--write",
        metavar="FILE",
        help="where the overlay goes (default: reweight.yaml next to BENCH_JSON)",
    )


def run(args: argparse.Namespace) -> int:
    from monitor.render import make_console
    from regen.manifest import load_manifest
    from regen.plan.report import build_plan

    manifest = load_manifest(args.manifest, args.override)
    plan = build_plan(manifest, args.tok_per_s, row_warnings=False)  # it lists them, once
    console = make_console()
    if args.reweight:
        return _reweight(args, plan, console)
    if args.json:
        console.out(plan.to_json(), highlight=False)
        return 0
    console.print(render_table(plan))
    table, line = render_near(plan)
    if table is not None:
        console.print(table)
    console.print(line, highlight=False)
    lo, hi = plan.hours
    llo, lhi = plan.limits_hours
    olo, ohi = plan.output_tokens
    console.print(
        f"time band at {plan.tok_per_s:g} tok/s: [bold]{duration(lo)} – {duration(hi)}[/] "
        f"({olo:,}–{ohi:,} output tokens)",
        highlight=False,
    )
    at_limits = f"{duration(llo)} – {duration(lhi)}" if lhi else "no limits set"
    native = plan.total("native_tokens")
    console.print(
        f"at the limits, one turn per sample: {at_limits}; native tokens passed through: "
        f"{native:,}; prompt tokens: {plan.token_estimate}",
        highlight=False,
    )
    for s in plan.sources:
        st = s.stats
        if st.rejected or st.filtered:
            why = ", ".join(f"{k} {v}" for k, v in sorted({**st.rejected, **st.filtered}.items()))
            console.print(f"{escape(s.name)}: {escape(why)}", highlight=False)
        for ex in st.examples:
            console.print(f"  [dim]{escape(ex)}[/]", highlight=False)
        if st.rejected_total > len(st.examples):
            shown = f"the first {len(st.examples)} of {st.rejected_total:,} rejected rows"
            console.print(f"  [dim]({shown}; --log-level DEBUG logs each)[/]", highlight=False)
    return 0


def _reweight(args: argparse.Namespace, plan: PlanReport, console: Console) -> int:
    """``--reweight``: the proposal as a table (or JSON) and the overlay file."""

    from regen.bench.report import read_report
    from regen.bench.reweight import overlay_yaml, reason, reweight

    report = read_report(args.reweight)
    regenerated = [s for s in plan.sources if s.mode == "regenerate"]
    current = {s.name: s.stats.kept for s in regenerated}
    exhausted = {s.name for s in regenerated if not s.stats.limit_reached}
    result = reweight(report, current, budget=args.budget, exhausted=exhausted)
    out = Path(args.write) if args.write else Path(args.reweight).with_name("reweight.yaml")
    text = overlay_yaml(result, manifest=args.manifest, bench=args.reweight, report=report)
    out.write_text(text, encoding="utf-8")
    if args.json:
        rows = [
            {
                "source": r.source,
                "current": r.current,
                "accept_length": r.accept,
                "weight": r.weight,
                "proposed": r.proposed,
                "exhausted": r.exhausted,
                "reason": reason(r, result.mean_accept),
            }
            for r in result.sources
        ]
        doc = {"overlay": str(out), "budget": result.budget, "mean_accept": result.mean_accept}
        console.out(json.dumps({**doc, "sources": rows}, indent=2), highlight=False)
        return 0
    t = Table(title=f"reweight: {plan.name} from {args.reweight}")
    for col in ("source", "accept", "weight", "now", "proposed", "change"):
        t.add_column(col, justify="left" if col == "source" else "right")
    for r in result.sources:
        change = "—" if r.change is None else f"{r.change:+.0%}"
        t.add_row(
            escape(r.source),
            "—" if r.accept is None else f"{r.accept:.2f}",
            f"{r.weight:.2f}",
            f"{r.current:,}",
            f"{r.proposed:,}" + ("*" if r.exhausted and r.proposed > r.current else ""),
            change,
        )
    t.caption = (
        f"mean acceptance {result.mean_accept:.2f}; budget {result.budget:,}; "
        "* its rows ran out: it cannot grow without more data"
    )
    console.print(t)
    console.print(
        f"overlay written to {escape(str(out))}; use it with: regen plan "
        f"{escape(args.manifest)} -o {escape(str(out))}",
        highlight=False,
        soft_wrap=True,
    )
    return 0


def duration(hours: float) -> str:
    """Hours for people: seconds, minutes or hours, whichever reads best."""
    if hours * 3600 < 120:
        return f"{hours * 3600:.0f} s"
    if hours < 2:
        return f"{hours * 60:.1f} min"
    return f"{hours:.1f} h"


def render_table(plan: PlanReport) -> Table:
    """The per-source table with a totals footer."""
    t = Table(title=f"plan: {plan.name}", show_footer=True)
    tot = plan.totals()
    cols = [
        ("source", "total"),
        ("read", f"{tot['read']:,}"),
        ("rejected", f"{tot['rejected']:,}"),
        ("filtered", f"{tot['filtered']:,}"),
        ("dup", f"{tot['duplicates']:,}"),
        ("near", f"{tot['near_duplicates']:,}"),
        ("kept", f"{tot['kept']:,}"),
        ("turns", f"{tot['regenerate_turns']:,}"),
        ("prompt tok", f"{tot['prompt_tokens']:,}"),
        ("output tok", "{:,}–{:,}".format(*plan.output_tokens)),
    ]
    for i, (head, foot) in enumerate(cols):
        t.add_column(head, footer=foot, justify="left" if i == 0 else "right")
    for s in plan.sources:
        st = s.stats
        out = "{:,}–{:,}".format(*s.output_tokens) if s.mode == "regenerate" else "native"
        t.add_row(
            s.name,
            f"{st.read:,}",
            f"{st.rejected_total:,}",
            f"{st.filtered_total:,}",
            f"{st.duplicates:,}",
            f"{st.near_duplicates:,}",
            f"{st.kept:,}" + ("*" if st.limit_reached and s.limit else ""),
            f"{st.regenerate_turns:,}",
            f"{s.prompt_tokens:,}",
            out,
        )
    if any(s.stats.limit_reached and s.limit for s in plan.sources):
        t.caption = "* reached the source's limit (reading stopped there)"
    return t


def render_near(plan: PlanReport) -> tuple[Table | None, str]:
    """Near-duplicates dropped per pair of sources (a row per source a prompt was dropped
    from, a column per source of the earlier prompt it repeats; only sources with drops) and
    a line with the settings."""
    d = plan.dedup
    if not d.near:
        return None, "near-duplicates: not checked (dedup.near is false)"
    near = plan.near_dict()
    how = (
        f"near-duplicates: threshold {d.threshold:g}, {d.shingle}-word shingles, "
        f"{d.num_perm} permutations ({near['bands']} bands × {near['rows']} rows)"
    )
    if not near["total"]:
        return None, f"{how}: none found"
    order = [s.name for s in plan.sources]
    rows = [n for n in order if any(a == n for a, _ in plan.near.counts)]
    cols = [n for n in order if any(b == n for _, b in plan.near.counts)]
    t = Table(title=f"near-duplicates dropped: {near['total']:,}")
    t.add_column("dropped from ↓ / duplicate of →")
    for c in cols:
        t.add_column(escape(c), justify="right")
    for r in rows:
        cells = [plan.near.counts.get((r, c), 0) for c in cols]
        t.add_row(escape(r), *(f"{n:,}" if n else "·" for n in cells))
    return t, f"{how}; examples of each pair: --json (near_duplicates.pairs)"
