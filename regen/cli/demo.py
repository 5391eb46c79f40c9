"""`regen demo`: the whole path offline on one machine, against a real local server.

Builds (once, cached under ``.cache/``) the tiny Kimi-format model from the demo tokenizer,
starts ``transformers serve`` on free loopback ports, runs ``manifests/demo.yaml`` through Ray
with those endpoints (live progress), exports for SpecForge, stops the servers and prints where
the Parquet parts and the export are. Ctrl-C leaves a resumable run directory: run the same
command again to continue.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from regen.cli._args import add_override_argument

NAME = "demo"
HELP = "run the demo end to end: tiny model, transformers serve, regen run, export"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--manifest", default="manifests/demo.yaml", help="(default: %(default)s)")
    p.add_argument(
        "--out", default="runs/demo", metavar="RUN_DIR", help="run directory (default: %(default)s)"
    )
    p.add_argument(
        "--export", default=None, metavar="DIR", help="export directory (default: RUN_DIR-export)"
    )
    p.add_argument("--cache", default=".cache", help="where the tiny model is built (%(default)s)")
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


def run(args: argparse.Namespace) -> int:
    import contextlib

    from rich.console import Console

    from regen.cli.main import EXIT_DONE
    from regen.cli.run import exit_code, run_with_view
    from regen.engine import RunOptions
    from regen.engine.actor import quiet_http_logs
    from regen.errors import ConfigError
    from regen.export import export_run
    from regen.manifest import load_manifest
    from regen.serving import TransformersServer, build_tiny_model
    from regen.store import RunDir, layout

    console = Console()
    quiet_http_logs()
    if args.servers < 1:
        raise ConfigError("--servers must be >= 1", field="--servers")
    base = load_manifest(args.manifest, args.override)
    cache = Path(args.cache)
    with console.status("building the tiny Kimi-format model (once)..."):
        model_dir = build_tiny_model(cache / "demo-model", base.resolve(base.target.tokenizer))
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
        summary = run_with_view(manifest, args.out, opts, view=not args.no_view)
    code = exit_code(summary)  # 0 only when every sample is done or permanently failed
    if code != EXIT_DONE:
        console.print(f"[yellow]{summary.state}[/]: {summary.done}/{summary.total} samples "
                      f"stored in {args.out} ({summary.failed_transient} left for the next "
                      "run); run the same command again to resume")  # fmt: skip
        return code
    e = manifest.export
    stats = export_run(
        RunDir.open(args.out, create=False),
        export_dir,
        seed=e.seed,
        drop_truncated=e.drop_truncated,
        max_length=e.max_length,
        shard_rows=e.shard_rows,
        drop_flags=e.drop_flags,
    )
    console.print(
        f"[bold green]done[/]: {summary.done}/{summary.total} samples "
        f"({summary.failed_permanent} failed permanently, {summary.failed_transient} left for "
        f"the next run)\n"
        f"  Parquet parts: {Path(args.out) / layout.PARTS_DIR}\n"
        f"  SpecForge export: {export_dir} ({stats.rows_written} rows, {stats.tokens} tokens)",
        highlight=False,
    )
    return 0
