"""`ray job submit -- python -m pipelines.train_draft RUN_DIR --config train.yaml ...`.

Thin entrypoint: the same arguments and the same code path as `regen train`
(regen.train.launch.launch_training). Exit codes: 0 submitted/finished (or dry run), 1 the
training job failed or stopped, 2 a regen error such as a trap (one line on stderr).
"""

from __future__ import annotations

from pipelines._environment import exit_with, missing_environment


def main(argv: list[str] | None = None) -> int:
    try:  # here, not at the top: a Python without regen's dependencies fails on this import
        from pipelines._entry import run_command
        from regen.cli import train as train_cmd
    except ModuleNotFoundError as e:
        return missing_environment(e, "python -m pipelines.train_draft")
    return run_command(train_cmd, "python -m pipelines.train_draft", argv)


if __name__ == "__main__":
    exit_with(main())
