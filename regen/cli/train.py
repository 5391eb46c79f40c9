"""`regen train RUN_DIR --config train.yaml`: launch EAGLE-3 draft training as a Ray GPU job."""

from __future__ import annotations

import argparse
import shlex
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from regen.cli.export import print_export

if TYPE_CHECKING:
    from regen.train.launch import TrainPlan

NAME = "train"
HELP = "export a finished run, write the SpecForge run config, and submit training to Ray"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (shared path)")
    parser.add_argument("--config", required=True, help="train.yaml")
    parser.add_argument("--address", default=None, help="Ray dashboard URL (default $RAY_ADDRESS)")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs to ask for (default: config)")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the config and command; submit nothing"
    )
    parser.add_argument(
        "--launcher-cmd",
        default=None,
        help="wrapper before `specforge train ...` on the cluster (default $REGEN_TRAIN_LAUNCHER)",
    )
    parser.add_argument(
        "--python", default=None, help="python on the cluster (default $REGEN_TRAIN_PYTHON)"
    )
    parser.add_argument(
        "--working-dir",
        default=None,
        help="ship this directory as the job's Ray working_dir (regen's code for the cluster)",
    )
    parser.add_argument(
        "--allow-drops",
        action="store_true",
        help="train even when the export drops more than export.max_drop_share of the rows",
    )
    parser.add_argument("--detach", action="store_true", help="submit and return; do not follow")
    parser.add_argument("--poll", type=float, default=10.0, help="seconds between status polls")


def run(args: argparse.Namespace) -> int:
    from monitor.render import make_console
    from regen.train.data import open_local
    from regen.train.launch import LaunchOptions, launch_training

    out = make_console()
    options = LaunchOptions(
        address=args.address,
        gpus=args.gpus,
        dry_run=args.dry_run,
        launcher=args.launcher_cmd,
        python=args.python,
        working_dir=args.working_dir,
        allow_drops=args.allow_drops,
        follow=not args.detach,
        poll_s=args.poll,
        on_state=lambda s: out.print(f"job state: [bold]{s}[/]"),
    )
    result = launch_training(open_local(args.run_dir), args.config, options)
    plan = result.plan
    print_plan(out, plan)
    if args.dry_run:
        return 0
    out.print(
        f"submitted {result.submission_id} ({plan.gpus} GPUs)", highlight=False, soft_wrap=True
    )
    if result.state in ("FAILED", "STOPPED"):
        out.print(
            f"[red]job {result.state}[/]: {escape(result.message or '')}",
            highlight=False,
            soft_wrap=True,
        )
        return 1
    return 0


def print_plan(out: Console, plan: TrainPlan) -> None:
    """What was exported, the vocab mapping, run.yaml and the exact command."""

    export = plan.export
    if export.stats is not None:
        how = f"exported now: {export.reason}" if export.reason else "up to date, reused"
        print_export(out, export.stats, f"export {export.dir} ({how})")
    scan = plan.scan
    out.print(
        f"data: {scan.rows} rows, {scan.loss_tokens} trained tokens of {scan.tokens} "
        f"({plan.prompts_path})",
        highlight=False,
        soft_wrap=True,
    )
    v = plan.vocab
    out.print(
        f"vocab mapping: {v.draft_vocab_size:,} of {v.vocab_size:,} ids from {v.loss_tokens:,} "
        f"loss tokens ({v.distinct_ids:,} distinct), covering {v.coverage:.1%} of them "
        f"({v.path})",
        highlight=False,
        soft_wrap=True,
    )
    tok = plan.tokenizer
    out.print(
        f"run vs target: tokenizer of {tok.vocab_size:,} tokens ({tok.path}) matches"
        if tok is not None
        else "run vs target: the run's tokenizer is not at hand here (checked on the cluster "
        "only if recorded)",
        highlight=False,
        soft_wrap=True,
    )
    out.rule(f"SpecForge run config {plan.run_yaml}")
    out.print(escape(plan.run_yaml.read_text(encoding="utf-8")), highlight=False, soft_wrap=True)
    out.rule("command")
    out.print(f"trainer argv:   {escape(shlex.join(plan.argv))}", highlight=False, soft_wrap=True)
    out.print(f"job entrypoint: {escape(plan.entrypoint)}", highlight=False, soft_wrap=True)
    out.print(f"GPUs requested: {plan.gpus}", highlight=False, soft_wrap=True)
    sf = plan.specforge_plan
    validated = (
        f"regen checks + SpecForge's planner ({sf.kind}, role {sf.role}: "
        f"`specforge train --config {plan.run_yaml} --plan`)"
        if sf is not None
        else "regen checks (SpecForge is not importable here: planned on the cluster)"
    )
    out.print(f"validated by:   {escape(validated)}", highlight=False, soft_wrap=True)
