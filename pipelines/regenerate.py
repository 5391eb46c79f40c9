"""`ray job submit --working-dir . -- python -m pipelines.regenerate MANIFEST --out RUN_DIR ...`.

Thin entrypoint: the same arguments and the same code path as `regen run` (the driver joins the
job's cluster through RAY_ADDRESS, which Ray sets for a submitted job). Exit codes as `regen run`
(regen.cli.main): 0 only when every sample is done or permanently failed, 75 when samples are
left for the next run (the job then reads FAILED; submitting it again continues), 2 a regen
error such as a bad manifest (one line on stderr), 130 interrupted.
"""

from __future__ import annotations

import sys

from pipelines._environment import missing_environment


def main(argv: list[str] | None = None) -> int:
    try:  # here, not at the top: a Python without regen's dependencies fails on this import
        from pipelines._entry import run_command
        from regen.cli import run as run_cmd
    except ModuleNotFoundError as e:
        return missing_environment(e, "python -m pipelines.regenerate")
    return run_command(run_cmd, "python -m pipelines.regenerate", argv)


if __name__ == "__main__":
    code = main()
    try:  # regen's quick exit (regen.cli.main.exit_now), when its environment is there
        from regen.cli.main import exit_now
    except ImportError:  # nothing native was loaded
        sys.exit(code)
    exit_now(code)
