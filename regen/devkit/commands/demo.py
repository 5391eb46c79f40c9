"""`regen demo [--train]`: the whole path offline on one machine, against a real local server.

Builds (once, cached under ``.cache/``) the demo target (regen.devkit.demo_target: a tiny
Llama model trained on the demo sources to answer in the Kimi format), starts ``transformers
serve`` on free loopback ports, runs ``manifests/demo.yaml`` through Ray with those endpoints
(live progress), exports for SpecForge with the manifest's export settings (rows kept, flagged
and dropped are printed), stops the servers and prints where the Parquet parts and the export
are. ``--train`` goes on: ``regen train``'s preparation with ``manifests/demo-train.yaml``,
then SpecForge's own trainer on this CPU for a few steps (regen.devkit.cpu_train), and prints the
loss curve and the checkpoint. Ctrl-C leaves a resumable run directory: run the same command
again to continue. ``--loop`` runs the whole loop instead, with vLLM as the server
(:mod:`regen.devkit.loop`: regenerate, train, serve target + draft, bench, reweight, round 2).

``--target FAMILY`` runs the same path on another family's demo target (:data:`TARGETS`:
``qwen3`` → ``manifests/demo-qwen3.yaml``, ``deepseek_v3`` → ``manifests/demo-deepseek.yaml``;
each builds its own demo target under ``.cache/demo-model-FAMILY`` and runs into
``runs/demo-FAMILY``); the default, ``kimi``, is the demo as it always was.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from regen.cli._args import add_override_argument
from regen.cli.bench import _levels
from regen.cli.export import print_export_warnings
from regen.cli.main import EXIT_DONE
from regen.cli.run import exit_code, run_with_view
from regen.core.errors import ConfigError

NAME = "demo"
#: ``--target``: each family's demo manifest, the cache folder of its demo target, and its
#: train config for ``--train`` / ``--loop`` (None: the demo trains Kimi's only)
TARGETS: dict[str, tuple[str, str, str | None]] = {
    "kimi": ("manifests/demo.yaml", "demo-model", "manifests/demo-train.yaml"),
    "qwen3": ("manifests/demo-qwen3.yaml", "demo-model-qwen3", "manifests/demo-train-qwen3.yaml"),
    "deepseek_v3": ("manifests/demo-deepseek.yaml", "demo-model-deepseek_v3", None),
}
HELP = (
    "run the demo end to end: demo target, transformers serve, regen run, export [, train]; "
    "--loop: the whole loop with vLLM"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        choices=sorted(TARGETS),
        default="kimi",
        help="the demo target's model family (default: %(default)s; the others run their own "
        "demo manifest and demo target; --loop and --train: kimi and qwen3)",
    )
    p.add_argument(
        "--manifest",
        default=None,
        help="(default: the target's demo manifest, manifests/demo.yaml for kimi)",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="RUN_DIR",
        help="run directory (default: runs/demo; with --loop the loop's folder, runs/demo-loop)",
    )
    p.add_argument(
        "--export", default=None, metavar="DIR", help="export directory (default: RUN_DIR-export)"
    )
    p.add_argument("--cache", default=".cache", help="where the demo target is built (%(default)s)")
    p.add_argument(
        "--servers",
        type=int,
        default=1,
        metavar="N",
        help="transformers serve processes (default 1)",
    )
    p.add_argument("--workers", type=int, metavar="N", help="Ray actors (manifest default)")
    p.add_argument("--concurrency", type=int, metavar="N", help="requests in flight per actor")
    p.add_argument("--limit", type=int, metavar="N", help="keep only the first N samples")
    add_override_argument(p)
    p.add_argument("--address", metavar="ADDR", help="Ray cluster to join (default: local)")
    p.add_argument("--force", action="store_true", help="continue a run dir of another manifest")
    p.add_argument("--no-view", action="store_true", help="no live progress view")  # fmt: skip
    p.add_argument(
        "--train",
        action="store_true",
        help="then train an EAGLE-3 draft with SpecForge on this CPU (a few minutes)",
    )
    p.add_argument(
        "--train-config",
        default=None,
        help="(default: the target's demo train config, manifests/demo-train.yaml for kimi)",
    )
    p.add_argument(
        "--train-steps", type=int, default=None, metavar="N", help="(default: 30; --loop: 100)"
    )
    loop = p.add_argument_group(
        "the whole loop on this machine (regen.devkit.loop; docs/engines.md)"
    )
    loop.add_argument(
        "--loop",
        action="store_true",
        help="vLLM serves the demo target; regenerate, train, serve target + draft, bench, "
        "reweight, and a second round (about half an hour of CPU; needs scripts/vllm-env)",
    )
    loop.add_argument("--rounds", type=int, default=2, metavar="N", help="(default: 2)")
    loop.add_argument(
        "--bench-concurrency",
        default="1,4",
        metavar="LIST",
        help="regen bench's levels in the loop (default: %(default)s)",
    )
    loop.add_argument(
        "--vllm-venv",
        metavar="DIR",
        help="vLLM's environment (default $REGEN_VLLM_VENV or .venv-vllm)",
    )


def run(args: argparse.Namespace) -> int:

    from monitor.render import make_console
    from regen.devkit.servers import TransformersServer, build_demo_target
    from regen.engine import RunOptions
    from regen.engine.actor import quiet_http_logs
    from regen.export import ExportSettings, export_run
    from regen.manifest import load_manifest
    from regen.store import RunDir, layout

    console = make_console()
    quiet_http_logs()
    target_manifest, model_folder, train_config = TARGETS[args.target]
    args.manifest = args.manifest or target_manifest
    args.train_config = args.train_config or train_config
    if (args.loop or args.train) and args.train_config is None:
        raise ConfigError(f"--target {args.target}: --loop and --train need a train config of its "
                          "demo target (--train-config)", field="--train-config")  # fmt: skip
    if args.loop:
        return _loop(console, args, model_folder)
    args.out = args.out or ("runs/demo" if args.target == "kimi" else f"runs/demo-{args.target}")
    args.train_steps = 30 if args.train_steps is None else args.train_steps
    if args.servers < 1:
        raise ConfigError("--servers must be >= 1", field="--servers")
    if args.train_steps < 1:
        raise ConfigError("--train-steps must be >= 1", field="--train-steps")
    load_manifest(args.manifest, args.override)  # a bad manifest stops here, before the build
    cache = Path(args.cache)
    with console.status("building the demo target (once: about two minutes of CPU)..."):
        model_dir = build_demo_target(cache / model_folder, args.manifest)
    export_dir = args.export or f"{args.out.rstrip('/')}-export"
    with contextlib.ExitStack() as stack:
        servers = []
        with console.status(f"starting {args.servers} transformers serve process(es)..."):
            for i in range(args.servers):
                srv = TransformersServer(model_dir, log_path=cache / f"demo-serve-{i}.log")
                servers.append(stack.enter_context(srv))
        console.print("servers: " + ", ".join(s.url for s in servers), highlight=False)
        # transformers serve lists the model under the path it was given
        manifest = load_manifest(
            args.manifest, [*args.override, f"target.model={servers[0].model_name}"]
        )
        opts = RunOptions(
            endpoints=[s.url for s in servers],
            workers=args.workers,
            concurrency=args.concurrency,
            limit=args.limit,
            force=args.force,
            address=args.address,
        )
        rd = RunDir.open(args.out, create=False)  # the command's one opening, passed on
        summary = run_with_view(manifest, rd, opts, view=not args.no_view)
    code = exit_code(summary)  # 0 only when every sample is done or permanently failed
    if code != EXIT_DONE:
        console.print(f"[yellow]{summary.state}[/]: {summary.done}/{summary.total} samples "
                      f"stored in {args.out} ({summary.failed_transient} left for the next "
                      "run); run the same command again to resume")  # fmt: skip
        return code
    stats = export_run(rd, export_dir, ExportSettings.of_run(rd))
    console.print(
        f"[bold green]done[/]: {summary.done}/{summary.total} samples "
        f"({summary.failed_permanent} failed permanently, {summary.failed_transient} left for "
        f"the next run)\n"
        f"  rows: {rows_line(stats)}\n"
        f"  Parquet parts: {Path(args.out).absolute() / layout.PARTS_DIR}\n"
        f"  SpecForge export: {Path(export_dir).absolute()} ({stats.rows_written} rows, "
        f"{stats.tokens} tokens)",
        highlight=False,
    )
    print_export_warnings(console, stats)
    if args.train:
        return _train(console, args, model_dir)
    return 0


def rows_line(stats: Any) -> str:
    """Rows kept, flagged and dropped (per reason) of an export (regen.store.layout.ExportStats)."""
    flagged = sum(f.rows for f in stats.flags.values())
    flags = ", ".join(f"{k} {v.rows}" for k, v in sorted(stats.flags.items()))
    dropped = sum(stats.dropped.values())
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(stats.dropped.items()))
    return (
        f"{stats.rows_read} read, {stats.rows_written} kept, {flagged} flagged"
        + (f" ({flags})" if flags else "")
        + f", {dropped} dropped"
        + (f" ({reasons})" if reasons else "")
    )


def _train(console: Any, args: argparse.Namespace, model_dir: Path) -> int:
    from regen.devkit.cpu_train import train_on_cpu

    with console.status(f"training an EAGLE-3 draft with SpecForge on CPU ({args.train_steps} "
                        "steps)..."):  # fmt: skip
        result = train_on_cpu(
            args.out, args.train_config, steps=args.train_steps, target_path=str(model_dir)
        )
    curve = result.curve
    console.print("SpecForge (CPU) draft training, loss per step:", highlight=False)
    train = " ".join(f"{s}:{v:.3f}" for s, v in curve.train)
    held = " ".join(f"{s}:{v:.3f}" for s, v in curve.held_out)
    console.print(f"  training  {train}\n  held-out  {held}", highlight=False, soft_wrap=True)
    if curve.held_out:
        first, last = curve.held_out[0][1], curve.held_out[-1][1]
        console.print(f"  held-out loss {first:.3f} -> {last:.3f} ({last / first:.2f}x)",
                      highlight=False)  # fmt: skip
    if curve.held_out_acceptance:
        (s0, a0), (s1, a1) = curve.held_out_acceptance[0], curve.held_out_acceptance[-1]
        console.print(
            f"  expected acceptance of the first drafted token (SpecForge): "
            f"{a0:.3f} at step {s0} -> {a1:.3f} at step {s1}",
            highlight=False,
        )
    console.print(
        f"  checkpoint: {curve.checkpoint or 'none written'}\n"
        f"  run config: {result.run_yaml}   log: {result.log_path}",
        highlight=False,
    )
    return 0 if curve.checkpoint else 1


def _loop(console: Any, args: argparse.Namespace, model_folder: str) -> int:
    """``--loop``: regen.devkit.loop, then its summary; exit 1 when greedy answers changed."""
    from regen.cli.main import EXIT_DONE, EXIT_FAILED
    from regen.devkit.loop import LoopSettings, run_loop
    from regen.devkit.loop.record import LOOP_JSON
    from regen.devkit.loop.rounds import LOOP_STEPS
    from regen.devkit.loop.summary import columns, print_summary

    try:
        levels = _levels(args.bench_concurrency)
    except argparse.ArgumentTypeError as e:
        from regen.core.errors import ConfigError

        raise ConfigError(f"--bench-concurrency: {e}", field="--bench-concurrency") from None
    settings = LoopSettings(
        manifest=args.manifest, train_config=args.train_config, model_folder=model_folder,
        out=Path(args.out or ("runs/demo-loop" if args.target == "kimi"
                              else f"runs/demo-loop-{args.target}")),
        cache=Path(args.cache), rounds=args.rounds,
        train_steps=LOOP_STEPS if args.train_steps is None else args.train_steps,
        concurrency=levels,
        overrides=list(args.override), workers=args.workers, run_concurrency=args.concurrency,
        address=args.address, view=not args.no_view, vllm_venv=args.vllm_venv,
    )  # fmt: skip
    rec = run_loop(settings, console)
    print_summary(rec, console)
    same = all(b.greedy.identical == b.greedy.prompts for _, b in columns(rec))
    console.print(f"loop record: {settings.out / LOOP_JSON}", highlight=False)
    return EXIT_DONE if same else EXIT_FAILED
