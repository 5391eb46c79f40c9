"""`regen status RUN_DIR [--json]`: the numbers of a run (the dashboard's numbers, once).

Exit 0, or 1 when the run directory reads as damaged: its progress file does not parse (state
``unknown``: the numbers shown are the part records', run ``regen verify RUN_DIR --repair``)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from rich.text import Text

if TYPE_CHECKING:
    from regen.status import RunNumbers

NAME = "status"
HELP = "samples done/failed/truncated/flagged, tokens, tok/s, ETA and state of a run directory"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory (path or URI)")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.add_argument("--stall-after", type=float, default=None, metavar="S",
                        help="call a live run stalled after S seconds without new tokens "
                        "(default 300)")  # fmt: skip


def run(args: argparse.Namespace) -> int:

    from monitor.plain import log_line
    from monitor.render import fmt_tokens, make_console, sources_table
    from regen.status import STALL_AFTER_S, RunView

    stall = STALL_AFTER_S if args.stall_after is None else args.stall_after
    n = RunView(args.run_dir).numbers(stall_after_s=stall)
    console = make_console(soft_wrap=args.json)
    code = 1 if n.state == "unknown" else 0
    if args.json:
        console.out(json.dumps(n.to_dict(), indent=1, ensure_ascii=False), highlight=False)
        return code
    console.print(Text(log_line(n)), soft_wrap=True)
    console.print(Text(f"run dir {n.uri}"), soft_wrap=True)
    if n.state == "unknown":
        console.print(
            Text(f"progress unknown: {n.state_reason}; the numbers below are what the part "
                 "records hold", style="bold red"),
            soft_wrap=True,
        )  # fmt: skip
    o = n.overall
    console.print(
        f"completion tokens {fmt_tokens(o.completion_tokens)} "
        f"(this session {fmt_tokens(n.session_tokens)}), prompt tokens "
        f"{fmt_tokens(o.prompt_tokens)}, rows {o.rows:,}",
        highlight=False,
    )
    if o.flagged or o.retried or o.retrying:
        flags = ", ".join(f"{k} {v:,}" for k, v in o.flags.items()) or "none left"
        console.print(
            f"flagged {o.flagged:,} samples (rows per flag: {flags}); new attempts "
            f"{o.retried:,} stored, {o.retrying:,} to go",
            highlight=False,
        )
    if o.stale.done:
        console.print(
            f"stale answers {o.stale.done:,} ({o.stale.rows:,} rows): their source rows were "
            "edited or left the plan since; kept in the parts, not counted, never exported",
            highlight=False,
        )
    if len(o.settings) > 1:
        console.print(Text(settings_line(n)), soft_wrap=True)
    console.print(sources_table(n, console.width))
    if n.damaged:
        from monitor.render import damage_note

        console.print(Text(damage_note(n), style="bold red"), soft_wrap=True)
    return code


def settings_line(n: RunNumbers) -> str:
    """``settings (regen run --force mixed them): 399d0f83 327 samples (sampling.temperature
    0.7), ...; keep one with regen export --setting ID``."""
    bits = []
    for sid, count in sorted(n.overall.settings.items(), key=lambda kv: (-kv[1], kv[0])):
        differs = n.settings_differ.get(sid) or {}
        what = ", ".join(f"{k} {json.dumps(v)}" for k, v in differs.items()) or "not recorded"
        bits.append(f"{sid} {count:,} samples ({what})")
    return (
        "settings (regen run --force mixed them): " + "; ".join(bits)
        + "; keep one with `regen export --setting ID`"
    )  # fmt: skip
