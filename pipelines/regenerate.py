"""`ray job submit --working-dir . -- python -m pipelines.regenerate MANIFEST --out RUN_DIR ...`.

Thin entrypoint: the same arguments and the same code path as `regen run` (the driver joins the
job's cluster through RAY_ADDRESS, which Ray sets for a submitted job). Exit codes as `regen run`
(regen.cli.main): 0 only when every sample is done or permanently failed, 75 when samples are
left for the next run (the job then reads FAILED; submitting it again continues), 2 a regen
error such as a bad manifest (one line on stderr), 130 interrupted.
"""

from __future__ import annotations

from pipelines._environment import exit_with, missing_environment


def main(argv: list[str] | None = None) -> int:
    try:  # here, not at the top: a Python without regen's dependencies fails on this import
        from pipelines._entry import run_command
        from regen.cli import run as run_cmd
    except ModuleNotFoundError as e:
        return missing_environment(e, "python -m pipelines.regenerate")
    return run_command(run_cmd, "python -m pipelines.regenerate", argv)


if __name__ == "__main__":
    exit_with(main())
