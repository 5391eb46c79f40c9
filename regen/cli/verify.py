"""`regen verify RUN_DIR [--repair] [--json]`: check a run directory, name every problem.

Exit 0 when the directory is clean (with ``--repair``: when the check after the repair is
clean), 1 with the list of problems otherwise, 2 on a regen error (e.g. ``--repair`` while a
live run holds the lock). The checks are :func:`regen.store.verify.verify_run`'s, the repairs
:mod:`regen.store.repair`'s.
"""

from __future__ import annotations

import argparse
import json

from rich.markup import escape

NAME = "verify"
HELP = "check a run directory's parts, journal, plan and counters (--repair fixes them)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory (path or URI)")
    parser.add_argument(
        "--repair",
        action="store_true",
        help="quarantine damaged parts; rebuild part records, the plan index and the "
        "progress counters from what they describe; fold the journal; then check again (the "
        "next `regen run` requests the lost samples again)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--no-plan",
        action="store_true",
        help="skip the plan checks (the plan index, stale answers, changed sources)",
    )


def run(args: argparse.Namespace) -> int:

    from monitor.render import make_console
    from regen.plan.index import rebuild
    from regen.store import RunDir
    from regen.store.verify import verify_run

    rd = RunDir.open(args.run_dir, create=False).require()
    rep = verify_run(rd, repair=args.repair, check_plan=not args.no_plan, rebuild_plan=rebuild)
    console = make_console(soft_wrap=True)
    if args.json:
        console.out(json.dumps(rep.to_dict(), indent=1, ensure_ascii=False), highlight=False)
        return 0 if rep.clean else 1
    where = escape(args.run_dir)
    for p in rep.found:
        console.print(f"  [yellow]found[/] {p.kind} {escape(p.line())}", highlight=False)
    for r in rep.repaired:
        console.print(f"  [green]repaired[/] {escape(r)}", highlight=False)
    head = "clean" if rep.clean else f"{len(rep.problems)} problem(s)"
    if rep.repaired:
        head = f"after the repair: {head}"
    console.print(
        f"{where}: {head}: {rep.parts} intact parts, {rep.samples:,} samples, {rep.rows:,} rows",
        highlight=False,
    )
    for p in rep.problems:
        console.print(f"  [red]{p.kind}[/] {escape(p.line())}", highlight=False)
    for n in rep.notes:
        console.print(f"  note: {escape(n)}", highlight=False)
    if not rep.clean:
        hint = (
            "the repair could not fix these: read why above"
            if args.repair
            else f"run `regen verify {where} --repair`, then rerun the job: the lost samples "
            "are requested again"
        )
        console.print(hint, highlight=False)
    return 0 if rep.clean else 1
