"""`regen monitor RUN_DIR`: the live dashboard of a run (reads the run directory only)."""

from __future__ import annotations

import argparse

from regen.core.errors import ConfigError

NAME = "monitor"
HELP = "live dashboard of a run directory (local path or pyarrow URI), while it runs or after"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory (path or URI)")
    parser.add_argument("--refresh", type=float, default=2.0, metavar="S",
                        help="seconds between refreshes (default 2)")  # fmt: skip
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("--width", type=int, default=None,
                        help="frame width in columns (default: the terminal's)")  # fmt: skip
    parser.add_argument("--stall-after", type=float, default=None, metavar="S",
                        help="call a live run stalled after S seconds without new tokens "
                        "(default 300)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from monitor.live import watch
    from monitor.render import frame, make_console
    from regen.status import STALL_AFTER_S, RunView

    if args.refresh <= 0:
        raise ConfigError("--refresh must be > 0", field="--refresh")
    stall = STALL_AFTER_S if args.stall_after is None else args.stall_after
    console = make_console(width=args.width)
    if args.once:
        numbers = RunView(args.run_dir).numbers(stall_after_s=stall)
        console.print(frame(numbers, width=console.width))
        return 0
    # a directory that does not exist (yet) is waited for: the frame says why it shows nothing
    watch(args.run_dir, refresh_s=args.refresh, console=console, stall_after_s=stall,
          log_every_s=max(args.refresh, 10.0))  # fmt: skip
    return 0
