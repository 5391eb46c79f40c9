"""What every `ray job submit` entrypoint does: a `regen` command's own arguments and code path,
under its own program name. Exit codes as the CLI (regen.cli.main): 0 done, 2 a regen error (one
line on stderr), 75 samples left for the next run, 130 interrupted.
"""

from __future__ import annotations

import argparse
from types import ModuleType

from regen.cli.main import invoke


def run_command(cmd: ModuleType, prog: str, argv: list[str] | None = None) -> int:
    """Parse ``argv`` with ``cmd.add_arguments`` and run ``cmd.run`` (a regen.cli module)."""
    parser = argparse.ArgumentParser(prog=prog, description=cmd.HELP)
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    cmd.add_arguments(parser)
    return invoke(cmd.run, parser.parse_args(argv))
