"""What every `ray job submit` entrypoint does: a `regen` command's own arguments and code path,
under its own program name. Exit codes as the CLI: 0 done, 2 a regen error (one line on stderr).
"""

from __future__ import annotations

import argparse
from types import ModuleType

from regen.cli.main import report_error, setup_logging
from regen.errors import RegenError


def run_command(cmd: ModuleType, prog: str, argv: list[str] | None = None) -> int:
    """Parse ``argv`` with ``cmd.add_arguments`` and run ``cmd.run`` (a regen.cli module)."""
    parser = argparse.ArgumentParser(prog=prog, description=cmd.HELP)
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    cmd.add_arguments(parser)
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        return int(cmd.run(args) or 0)
    except RegenError as e:
        report_error(e)
        return 2
