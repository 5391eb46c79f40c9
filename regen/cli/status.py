"""`regen status RUN_DIR [--json]`: the numbers of a run (the dashboard's numbers, once)."""

from __future__ import annotations

import argparse
import json

NAME = "status"
HELP = "samples done/failed/truncated/flagged, tokens, tok/s, ETA and state of a run directory"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory (path or URI)")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.add_argument("--stall-after", type=float, default=None, metavar="S",
                        help="call a live run stalled after S seconds without new tokens "
                        "(default 300)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.text import Text

    from monitor.plain import log_line
    from monitor.render import fmt_tokens, sources_table
    from regen.status import STALL_AFTER_S, RunView

    stall = STALL_AFTER_S if args.stall_after is None else args.stall_after
    n = RunView(args.run_dir).numbers(stall_after_s=stall)
    console = Console(soft_wrap=args.json)
    if args.json:
        console.out(json.dumps(n.to_dict(), indent=1, ensure_ascii=False), highlight=False)
        return 0
    console.print(Text(log_line(n)), soft_wrap=True)
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
    console.print(sources_table(n, console.width))
    if n.damaged:
        from monitor.render import damage_note

        console.print(Text(damage_note(n), style="bold red"), soft_wrap=True)
    return 0
