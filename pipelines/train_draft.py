"""`ray job submit -- python -m pipelines.train_draft RUN_DIR --config train.yaml`.

Thin entrypoint: the same path as `regen train` (regen.train.launch.launch_training).
"""

from __future__ import annotations

import argparse
import logging
import sys

from regen.errors import RegenError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.train_draft")
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("--config", required=True)
    parser.add_argument("--address", default=None)
    parser.add_argument("--gpus", type=int, default=None)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--launcher-cmd", default=None)
    parser.add_argument("--python", default=None)
    parser.add_argument("--working-dir", default=None)
    parser.add_argument("--detach", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from regen.train.launch import launch_training

    try:
        result = launch_training(
            args.run_dir,
            args.config,
            address=args.address,
            gpus=args.gpus,
            dry_run=args.dry_run,
            launcher=args.launcher_cmd,
            python=args.python,
            working_dir=args.working_dir,
            follow=not args.detach,
        )
    except RegenError as e:
        logging.getLogger("pipelines.train_draft").error("%s", e)
        return 2
    logging.getLogger("pipelines.train_draft").info(
        "trainer argv %s; job %s state %s", result.plan.argv, result.submission_id, result.state
    )
    return 1 if result.state in ("FAILED", "STOPPED") else 0


if __name__ == "__main__":
    sys.exit(main())
