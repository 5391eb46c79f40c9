"""`ray job submit --working-dir . -- python -m pipelines.regenerate MANIFEST --out RUN_DIR ...`.

Thin entrypoint: the same arguments and the same code path as `regen run` (the driver joins the
job's cluster through RAY_ADDRESS, which Ray sets for a submitted job). Exit codes: 0 done,
2 a regen error (one line on stderr), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys

from regen.cli import run as run_cmd
from regen.cli.main import setup_logging
from regen.errors import RegenError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.regenerate", description=run_cmd.HELP
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    run_cmd.add_arguments(parser)
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        return run_cmd.execute(args)
    except RegenError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
