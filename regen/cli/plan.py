"""`regen plan MANIFEST`: read every source and show counts, rejects, tokens and the time band."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from regen.cli._args import add_override_argument

if TYPE_CHECKING:
    from regen.plan import Plan

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


def run(args: argparse.Namespace) -> int:
    from regen.manifest import load_manifest
    from regen.plan import build_plan

    manifest = load_manifest(args.manifest, args.override)
    plan = build_plan(manifest, args.tok_per_s)
    console = Console()
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
    return 0


def duration(hours: float) -> str:
    """Hours for people: seconds, minutes or hours, whichever reads best."""
    if hours * 3600 < 120:
        return f"{hours * 3600:.0f} s"
    if hours < 2:
        return f"{hours * 60:.1f} min"
    return f"{hours:.1f} h"


def render_table(plan: Plan) -> Table:
    """The per-source table with a totals footer."""
    t = Table(title=f"plan: {plan.name}", show_footer=True)
    tot = plan.to_dict()["total"]
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
        ("output tok", "{:,}–{:,}".format(*tot["output_tokens"])),
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
    t.caption = "* reached the source's limit (reading stopped there)"
    return t


def render_near(plan: Plan) -> tuple[Table | None, str]:
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
