"""`ray job submit --working-dir . -- python -m pipelines.regenerate MANIFEST --out RUN_DIR ...`.

Thin entrypoint: the same arguments and the same code path as `regen run` (the driver joins the
job's cluster through RAY_ADDRESS, which Ray sets for a submitted job). Exit codes: 0 done,
2 a regen error (one line on stderr), 130 interrupted.
"""

from __future__ import annotations

import sys

from pipelines._entry import run_command
from regen.cli import run as run_cmd


def main(argv: list[str] | None = None) -> int:
    return run_command(run_cmd, "python -m pipelines.regenerate", argv)


if __name__ == "__main__":
    sys.exit(main())
