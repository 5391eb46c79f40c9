"""`regen run MANIFEST --out RUN_DIR`: regenerate (or resume) a job through Ray."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from regen.cli._args import (
    absolute_run_dir,
    add_api_key_arguments,
    add_override_argument,
    api_key_fields,
)
from regen.cli.main import EXIT_DONE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_LEFT
from regen.core.errors import ConfigError

if TYPE_CHECKING:
    from regen.engine import JobSummary, RunOptions
    from regen.manifest import Manifest
    from regen.store import RunDir

T = TypeVar("T")

NAME = "run"
HELP = "regenerate the manifest's samples into a run directory (running it again resumes)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("manifest", metavar="MANIFEST", help="manifest YAML")
    p.add_argument(
        "--out",
        required=True,
        metavar="RUN_DIR",
        help="run directory: local path or pyarrow URI (s3://..., file://...)",
    )
    p.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="URL",
        help="OpenAI-compatible base URL incl. /v1 (repeatable; replaces the manifest's endpoints)",
    )
    add_api_key_arguments(p, "the --endpoint servers")
    p.add_argument("--workers", type=int, metavar="N", help="Ray actors (engine.workers)")
    p.add_argument(
        "--concurrency",
        type=int,
        metavar="N",
        help="requests in flight per actor (engine.concurrency)",
    )
    p.add_argument("--limit", type=int, metavar="N", help="keep only the first N samples")
    add_override_argument(p)
    _add_retry_arguments(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="continue a run directory made by a different manifest fingerprint",
    )
    p.add_argument(
        "--address",
        metavar="ADDR",
        help="Ray cluster to join (default $RAY_ADDRESS, else a local Ray)",
    )
    _add_after_arguments(p)


def _add_retry_arguments(p: argparse.ArgumentParser) -> None:
    """``--retry-failed``, ``--retry-flagged``, ``--flagged-retries``."""
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="request samples with a recorded permanent failure again",
    )
    p.add_argument(
        "--retry-flagged",
        metavar="FLAGS",
        help="request done samples whose latest answer carries one of these quality flags "
        "again, as a new attempt with another seed (comma list of repetition, empty_content, "
        "reasoning_unclosed, language_mismatch, refusal, bad_tool_call; or default, all); both "
        "attempts stay in the run directory, the latest wins in export (docs/quality.md)",
    )
    p.add_argument(
        "--flagged-retries",
        type=int,
        default=1,
        metavar="N",
        help="new attempts a flagged sample may have in all (default 1: rerunning the same "
        "command after it finished requests nothing more)",
    )


def _add_after_arguments(p: argparse.ArgumentParser) -> None:
    """What runs beside and after the run: training, metrics, the view, the actors' output."""
    p.add_argument(
        "--then-train",
        metavar="TRAIN_YAML",
        help="when the run finishes, submit training with this config (regen train)",
    )
    p.add_argument(
        "--train-address",
        metavar="URL",
        help="Ray dashboard URL for the training job (default: $RAY_ADDRESS, else local)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="also serve regen's metrics for Prometheus on 127.0.0.1:PORT/metrics, under the "
        "names Ray exports them with (ray_regen_*); without it they reach Prometheus through "
        "Ray's metrics export only (docs/metrics.md)",
    )
    p.add_argument("--no-view", action="store_true", help="no live progress view")  # fmt: skip
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show the Ray actors' own output (tracebacks of a failing worker included) here; "
        "by default it stays in Ray's worker log files and a lost worker is one line",
    )


def options_from_args(args: argparse.Namespace) -> RunOptions:
    """The session's options from the parsed flags (``--endpoint`` URLs with the key of
    ``--api-key-env`` / ``--api-key-file``: the driver resolves them, regen.engine.driver)."""
    from regen.engine import RunOptions
    from regen.quality import parse_flags

    if args.limit is not None and args.limit < 0:
        raise ConfigError("--limit must be >= 0", field="--limit")
    flagged = getattr(args, "retry_flagged", None)
    retries = getattr(args, "flagged_retries", 1)
    if retries < 1:
        raise ConfigError("--flagged-retries must be >= 1", field="--flagged-retries")
    retry_flagged = parse_flags(flagged, "--retry-flagged") if flagged is not None else ()
    if flagged is not None and not retry_flagged:
        raise ConfigError("--retry-flagged needs at least one flag", field="--retry-flagged")
    keys = api_key_fields(args)
    if keys and not args.endpoint:
        raise ConfigError(
            "--api-key-env / --api-key-file go with --endpoint (the manifest's endpoints name "
            "their own keys)",
            field="--api-key-env",
        )
    return RunOptions(
        endpoints=list(args.endpoint) or None,
        api_key_env=keys.get("api_key_env"),
        api_key_file=keys.get("api_key_file"),
        workers=args.workers,
        concurrency=args.concurrency,
        limit=args.limit,
        retry_failed=args.retry_failed,
        retry_flagged=retry_flagged,
        flagged_retries=retries,
        force=args.force,
        address=args.address,
        verbose=getattr(args, "verbose", False),
    )


def run_with_view(manifest: Manifest, rd: RunDir, opts: RunOptions, *, view: bool) -> JobSummary:
    """``run_job`` on the run directory ``rd`` (its command's one opening) with the live
    dashboard in a thread of this process when ``view`` (shared with ``regen demo``), reading
    the same handle; returns the job summary."""
    from regen.engine import run_job

    stop_view = threading.Event()
    thread = None
    if view:
        from monitor.live import run_in_thread

        started = threading.Event()
        opts.on_progress = _also(opts.on_progress, lambda _snap: started.set())
        thread = run_in_thread(rd, stop_view, log_every_s=30.0, started=started)
    try:
        return run_job(manifest, rd, opts)
    finally:
        stop_view.set()
        if thread is not None:
            thread.join(timeout=10)


def _also(first: Callable[[T], None] | None, then: Callable[[T], None]) -> Callable[[T], None]:
    """A callback that calls ``first`` (when there is one), then ``then``."""

    def both(value: T) -> None:
        if first is not None:
            first(value)
        then(value)

    return both


def execute(args: argparse.Namespace, *, view: bool = True) -> int:
    """Run the job described by parsed arguments; shared with pipelines.regenerate."""

    from monitor.render import make_console
    from regen.engine.actor import quiet_http_logs
    from regen.manifest import load_manifest

    quiet_http_logs()
    console = make_console()
    args.out = absolute_run_dir(args.out)
    manifest = load_manifest(args.manifest, args.override)
    opts = options_from_args(args)
    view = view and not getattr(args, "no_view", False)
    from regen.store import RunDir

    rd = RunDir.open(args.out, create=False)  # the command's one opening, passed on
    metrics = _start_metrics(rd, getattr(args, "metrics_port", None))
    try:
        summary = run_with_view(manifest, rd, opts, view=view)
    finally:
        metrics.stop()
    console.print(
        f"[bold]{summary.state}[/]: {summary.done:,}/{summary.total:,} samples done "
        f"({summary.completed_now:,} this session"
        + (f", {summary.retried_now:,} of them new attempts" if summary.retried_now else "")
        + f"), {summary.failed_permanent:,} failed "
        f"permanently, {summary.failed_transient:,} left for the next run; "
        f"run dir {summary.run_dir}",
        highlight=False,
    )
    code = exit_code(summary)
    if code == EXIT_INTERRUPTED:
        console.print("run the same command again to resume", highlight=False)
    elif code == EXIT_LEFT:
        console.print(
            f"some samples ran out of retries: run the same command again (exit {EXIT_LEFT})",
            highlight=False,
        )
    if code != EXIT_DONE:
        if args.then_train:
            console.print("training not submitted: the run is not complete", highlight=False)
        return code
    if args.then_train:
        return _then_train(args, rd, console)
    return EXIT_DONE


def _start_metrics(rd: RunDir, port: int | None):  # -> RunMetrics
    """regen's metrics for the run in ``rd`` (through Ray; on 127.0.0.1:``port`` too)."""
    from regen.engine.metrics import start_run_metrics

    if port is not None and not 0 <= port <= 65535:
        raise ConfigError(f"--metrics-port {port} is not a port", field="--metrics-port")
    try:
        return start_run_metrics(rd, port)
    except OSError as e:
        raise ConfigError(
            f"--metrics-port: cannot listen on 127.0.0.1:{port}: {e}", field="--metrics-port"
        ) from None


def exit_code(summary: JobSummary) -> int:
    """How a finished session exits (regen.cli.main lists the codes): 0 only when every sample
    is done or permanently failed; 75 when some are left for the next run; 130 interrupted."""
    if summary.state == "interrupted":
        return EXIT_INTERRUPTED
    if summary.state != "finished" or summary.failed_transient:
        return EXIT_LEFT
    return EXIT_DONE


def _then_train(args: argparse.Namespace, rd: RunDir, console) -> int:
    """Submit the training job (regen train's path) and return: it runs for hours on the GPUs;
    `regen status`-style following is `regen train ... ` or Ray's own `ray job logs`."""
    from regen.store import layout
    from regen.train.data import open_local
    from regen.train.launch import LaunchOptions, launch_training

    options = LaunchOptions(address=args.train_address, follow=False)
    result = launch_training(open_local(rd), args.then_train, options)
    console.print(
        f"training job {result.submission_id} submitted ({result.state}); its record: "
        f"{args.out.rstrip('/')}/{layout.JOB}",
        highlight=False,
        soft_wrap=True,
    )
    return EXIT_DONE if result.state not in ("FAILED", "STOPPED") else EXIT_FAILED


def run(args: argparse.Namespace) -> int:
    return execute(args)
