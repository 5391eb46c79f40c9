"""`regen verify RUN_DIR [--repair] [--json]`: check a run directory, name every problem.

Exit 0 when the directory is clean (or ``--repair`` fixed everything it found), 1 with the list
of problems otherwise, 2 on a regen error (e.g. ``--repair`` while a live run holds the lock).
The checks are :func:`regen.store.verify.verify_run`'s.
"""

from __future__ import annotations

import argparse
import json

NAME = "verify"
HELP = "check a run directory's parts, journal, plan and counters (--repair fixes them)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory (path or URI)")
    parser.add_argument(
        "--repair",
        action="store_true",
        help="quarantine damaged parts, fold the journal, rewrite the counters "
        "(the next `regen run` requests the lost samples again)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--no-plan",
        action="store_true",
        help="do not re-read the sources to check ids against the plan",
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from regen.errors import RunDirError
    from regen.store import RunDir
    from regen.store.verify import verify_run

    rd = RunDir.open(args.run_dir, create=False)
    if not rd.exists(""):
        raise RunDirError(f"run directory {args.run_dir!r} does not exist")
    rep = verify_run(rd, repair=args.repair, check_plan=not args.no_plan)
    fixed = bool(rep.repaired) and args.repair
    console = Console(soft_wrap=True)
    if args.json:
        console.out(json.dumps(rep.to_dict(), indent=1, ensure_ascii=False), highlight=False)
    else:
        head = "clean" if rep.clean else f"{len(rep.problems)} problem(s)"
        console.print(
            f"{escape(args.run_dir)}: {head}: {rep.parts} intact parts, "
            f"{rep.samples:,} samples, {rep.rows:,} rows",
            highlight=False,
        )
        for p in rep.problems:
            console.print(f"  [red]{p.kind}[/] {escape(p.line())}", highlight=False)
        for n in rep.notes:
            console.print(f"  note: {escape(n)}", highlight=False)
        for r in rep.repaired:
            console.print(f"  [green]repaired[/] {escape(r)}", highlight=False)
        if not rep.clean and not fixed:
            console.print(
                f"run `regen verify {escape(args.run_dir)} --repair`, then rerun the "
                "job: the lost samples are requested again",
                highlight=False,
            )
    return 0 if rep.clean or fixed else 1
