"""The loop itself: the target server, then each round's steps, the untrained draft after round
1, and the summary (see :mod:`regen.devkit.loop` for the pipeline, :mod:`regen.devkit.loop.record`
for the files).

Every step that is a regen command runs as that command (``regen run``, ``regen serve-command``,
``regen verify-server``, ``regen bench``, ``regen plan --reweight``), printed first as the line
a user would type; a regen error stops the loop with that command's one-line message. The
other steps are regen's CPU training (:func:`regen.devkit.cpu_train.train_on_cpu`), SpecForge's
exporter (:mod:`regen.devkit.loop.drafts`) and the servers (:mod:`regen.devkit.loop.servers`);
the greedy answers are compared by the bench itself (:mod:`regen.bench.greedy`).

Run again, the same command picks up where the loop was: each round's ``regen run`` resumes
(nothing is regenerated twice); the training, the drafts and the benches are done again.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from regen.bench.report import BENCH_JSON, BenchReport, read_report
from regen.cli.main import EXIT_DONE, build_parser
from regen.core.errors import ConfigError, RunIncompleteError
from regen.devkit.cpu_train import train_on_cpu
from regen.devkit.loop import drafts, record
from regen.devkit.loop.record import (
    BenchRecord,
    GreedyRecord,
    LevelRecord,
    LoopRecord,
    RoundRecord,
)
from regen.devkit.loop.servers import MAX_NUM_SEQS, speculative_server, target_server, vllm_python
from regen.devkit.servers import build_demo_target
from regen.devkit.servers.vllm import VllmServer
from regen.manifest import load_manifest, read_yaml_file
from regen.store import RunDir
from regen.store import layout as L

if TYPE_CHECKING:
    from regen.devkit.cpu_train import CpuTrainResult

log = logging.getLogger(__name__)

#: draft tokens per step: vLLM's num_speculative_tokens, and the trainer's unroll to match
NUM_SPECULATIVE_TOKENS = 3
#: training steps per round (the demo's 49-row export: about two epochs)
LOOP_STEPS = 100
#: what the loop changes in --train-config's training section: a higher learning rate and an
#: unroll as long as the served drafts (a tiny draft learns the demo target's answers in a
#: hundred steps on CPU), and epochs enough for the steps (max_steps stops it)
LOOP_TRAINING: dict[str, Any] = {"lr": 3e-3, "ttt_length": NUM_SPECULATIVE_TOKENS, "epochs": 10}
#: samples per source held out of training for the bench (export.holdout)
LOOP_HOLDOUT = 2


@dataclass(slots=True)
class LoopSettings:
    """``regen demo --loop``'s flags, resolved."""

    manifest: str = "manifests/demo.yaml"
    train_config: str = "manifests/demo-train.yaml"
    #: the demo target's folder under ``cache`` (each family's demo target has its own)
    model_folder: str = "demo-model"
    out: Path = Path("runs/demo-loop")
    cache: Path = Path(".cache")
    rounds: int = 2
    train_steps: int = LOOP_STEPS
    holdout: int = LOOP_HOLDOUT
    per_source: int = LOOP_HOLDOUT
    concurrency: list[int] = field(default_factory=lambda: [1, 4])
    max_tokens: int = 128
    overrides: list[str] = field(default_factory=list)
    workers: int | None = None
    run_concurrency: int | None = None
    address: str | None = None
    view: bool = True
    vllm_venv: str | None = None

    def check(self) -> None:
        if self.rounds < 1:
            raise ConfigError("--rounds must be >= 1", field="--rounds")
        if self.train_steps < 1:
            raise ConfigError("--train-steps must be >= 1", field="--train-steps")
        if 1 not in self.concurrency:
            raise ConfigError("--bench-concurrency must include 1: the greedy answers are "
                              "compared there", field="--bench-concurrency")  # fmt: skip
        if max(self.concurrency) > MAX_NUM_SEQS:
            raise ConfigError(f"--bench-concurrency levels must be <= {MAX_NUM_SEQS} (the "
                              "servers' --max-num-seqs)", field="--bench-concurrency")  # fmt: skip


@contextlib.contextmanager
def timed(wall: dict[str, float], step: str) -> Iterator[None]:
    t0 = time.monotonic()
    try:
        yield
    finally:
        wall[step] = round(time.monotonic() - t0, 1)


class Loop:
    """One ``regen demo --loop``: :meth:`run` does it all."""

    def __init__(self, settings: LoopSettings, console: Any) -> None:

        settings.check()
        self.s = settings
        self.console = console
        self.out = settings.out
        self.python = vllm_python(settings.vllm_venv)
        # a bad manifest stops here; the servers serve its model name, with its family's flags
        manifest = load_manifest(settings.manifest, settings.overrides)
        self.served = manifest.target.model
        self.family = manifest.family()
        self.model_dir = (settings.cache / settings.model_folder).resolve()  # built by run()
        self.train_yaml = self.out / record.TRAIN_YAML  # written by run()
        self.record = LoopRecord(
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            manifest=settings.manifest,
            train_config=settings.train_config,
            train_steps=settings.train_steps,
            concurrency=sorted(set(settings.concurrency)),
            per_source=settings.per_source,
            max_tokens=settings.max_tokens,
            num_speculative_tokens=NUM_SPECULATIVE_TOKENS,
        )

    # ---- the pipeline ---------------------------------------------------------------------

    def run(self) -> LoopRecord:
        """The whole loop; SIGTERM stops it as Ctrl-C does (every server it started stopped)."""
        with _sigterm_interrupts():
            return self._run()

    def _run(self) -> LoopRecord:

        t0 = time.monotonic()
        self.out.mkdir(parents=True, exist_ok=True)
        with self.console.status("building the demo target (once: a few minutes of CPU)..."):
            self.model_dir = build_demo_target(self.model_dir, self.s.manifest)
        self.write_train_config()
        self.step("vLLM serves the demo target")
        target = target_server(self.python, self.model_dir, served_name=self.served,
                               log_path=record.log_file(self.out, "vllm-target"),
                               family=self.family)  # fmt: skip
        with self.console.status("starting vLLM (the target alone)..."):
            target.start()
        try:
            self.record.target_start_s = round(target.start_s or 0.0, 1)
            self.note(f"target at {target.url} (healthy after {target.start_s:.0f} s)")
            overlay: Path | None = None
            for n in range(1, self.s.rounds + 1):
                rnd = self.one_round(n, target, overlay)
                self.record.rounds.append(rnd)
                record.write_record(self.out, self.record)
                if n == 1:
                    self.record.untrained = self.untrained(target)
                    record.write_record(self.out, self.record)
                overlay = Path(rnd.reweight) if rnd.reweight else None
        finally:
            target.stop()
        self.record.wall_s = round(time.monotonic() - t0, 1)
        record.write_record(self.out, self.record)
        return self.record

    def one_round(self, n: int, target: VllmServer, overlay: Path | None) -> RoundRecord:
        name = f"round-{n}"
        run_dir = record.round_dir(self.out, n)
        overlays = [str(overlay)] if overlay is not None else []
        overrides = [*self.s.overrides, f"export.holdout={self.s.holdout}", *overlays]
        wall: dict[str, float] = {}
        self.step(f"round {n}: regenerate the demo sources with vLLM"
                  + (f" (limits from {overlay})" if overlay else ""))  # fmt: skip
        with timed(wall, "regenerate"):
            self.regenerate(run_dir, target, overrides)
        self.step(f"round {n}: SpecForge trains an EAGLE-3 draft on CPU ({self.s.train_steps} "
                  "steps)")  # fmt: skip
        with timed(wall, "train"):
            trained = self.train(run_dir)
        checkpoint = trained.curve.checkpoint
        if checkpoint is None:
            raise ConfigError(f"SpecForge wrote no checkpoint ({trained.log_path})")
        self.step(f"round {n}: the draft, exported and copied for vLLM")
        with timed(wall, "draft"):
            draft, copy = self.draft(name, run_dir, checkpoint)
        bench = self.bench(name, target, run_dir, copy, run_dir / record.ROUND_BENCH, wall)
        reweight = record.reweight_file(self.out, n)
        self.step(f"round {n}: the next round's limits from the bench")
        with timed(wall, "reweight"):
            self.regen(["plan", self.s.manifest, *_o(overrides), "--reweight",
                        bench.bench_json, "--write", str(reweight)])  # fmt: skip
        stats = L.EXPORT_STATS_FILE.read(RunDir.open(str(run_dir / L.EXPORT_DIR), create=False))
        plan = L.PLAN_FILE.read(RunDir.open(str(run_dir), create=False))
        if stats is None or plan is None:
            raise ConfigError(f"{run_dir}: the round left no plan or no export stats")
        return RoundRecord(
            round=n, run_dir=str(run_dir), overlays=overlays,
            limits=overlay_limits(overlay) if overlay else {},
            samples={k: e.total for k, e in plan.sources.items()},
            rows_read=stats.rows_read, rows_kept=stats.rows_written,
            held_out=int(getattr(stats, "holdout_samples", 0) or 0),
            loss=trained.curve.held_out, expected_accept=trained.curve.held_out_acceptance,
            train_steps=self.s.train_steps, checkpoint=checkpoint, draft=str(draft),
            draft_vllm=str(copy), bench=bench, reweight=str(reweight), wall_s=wall,
        )  # fmt: skip

    def untrained(self, target: VllmServer) -> BenchRecord:
        """A never-trained draft of round 1's config, benched on round 1's prompts."""
        run_dir = record.round_dir(self.out, 1)
        self.step("a never-trained draft of the same config, for comparison")
        state = drafts.untrained_state(run_dir, self.out / record.UNTRAINED_STATE)
        _, copy = self.draft(record.UNTRAINED, run_dir, str(state))
        return self.bench(record.UNTRAINED, target, run_dir, copy,
                          record.untrained_bench_dir(self.out), {})  # fmt: skip

    # ---- the steps ------------------------------------------------------------------------

    def regenerate(self, run_dir: Path, target: VllmServer, overrides: list[str]) -> None:
        argv = ["run", self.s.manifest, "--out", str(run_dir), "--endpoint", target.url,
                *_o(overrides)]  # fmt: skip
        for flag, value in (("--workers", self.s.workers), ("--address", self.s.address),
                            ("--concurrency", self.s.run_concurrency)):  # fmt: skip
            if value is not None:
                argv += [flag, str(value)]
        if not self.s.view:
            argv.append("--no-view")
        code = self.regen(argv)
        if code != EXIT_DONE:
            raise RunIncompleteError(
                f"{run_dir}: regen run ended with exit code {code} (samples left): run the same "
                "command again to resume the loop"
            )

    def train(self, run_dir: Path) -> CpuTrainResult:

        with self.console.status(f"training ({self.s.train_steps} steps on CPU)..."):
            result = train_on_cpu(run_dir, self.train_yaml, steps=self.s.train_steps,
                                  target_path=str(self.model_dir))  # fmt: skip
        held = result.curve.held_out
        if held:
            self.note(f"held-out loss {held[0][1]:.3f} (untrained) -> {held[-1][1]:.3f} "
                      f"(step {held[-1][0]}); log {result.log_path}")  # fmt: skip
        return result

    def draft(self, name: str, run_dir: Path, checkpoint: str) -> tuple[Path, Path]:
        """SpecForge's exporter, then ``regen serve-command --engine vllm`` (the vLLM copy)."""
        out = record.draft_dir(self.out, name)
        argv = drafts.export_argv(checkpoint, run_dir, out)
        self.show(shlex.join(["python", *argv[1:]]))
        drafts.export_draft(argv, out, record.log_file(self.out, f"export-{name}"))
        copy = record.vllm_copy_dir(self.out, name)
        self.regen(["serve-command", str(out), "--engine", "vllm", "--config",
                    str(self.train_yaml), "--target", str(self.model_dir), "--vllm-draft-dir",
                    str(copy)])  # fmt: skip
        return out, copy

    def bench(
        self,
        name: str,
        target: VllmServer,
        run_dir: Path,
        copy: Path,
        bench_dir: Path,
        wall: dict[str, float],
    ) -> BenchRecord:
        """Serve target + draft, verify it, and bench it against the target alone (the bench
        compares the greedy answers too)."""
        self.step(f"{name}: vLLM serves the target with the draft (EAGLE-3), then regen bench")
        with timed(wall, "serve"):
            spec = speculative_server(
                self.python, self.model_dir, copy, served_name=self.served,
                num_speculative_tokens=NUM_SPECULATIVE_TOKENS,
                log_path=record.log_file(self.out, f"vllm-{name}"), family=self.family,
            )  # fmt: skip
            with self.console.status("starting vLLM (target + draft)..."):
                spec.start()
        try:
            self.note(f"speculative server at {spec.url} (healthy after {spec.start_s:.0f} s)")
            self.regen(["verify-server", spec.url, "--draft", str(copy)])
            with timed(wall, "bench"):
                self.regen(["bench", "--baseline", target.url, "--speculative", spec.url,
                            "--run", str(run_dir), "--per-source", str(self.s.per_source),
                            "--concurrency", ",".join(map(str, self.record.concurrency)),
                            "--max-tokens", str(self.s.max_tokens), "--temperature", "0",
                            "--draft", str(copy), "--out", str(bench_dir)])  # fmt: skip
        finally:
            spec.stop()
        report = read_report(bench_dir / BENCH_JSON)
        benched = bench_record(report, bench_dir / BENCH_JSON, spec.start_s)
        g = benched.greedy
        self.note(f"greedy answers identical with and without the draft: "
                  f"{g.identical}/{g.prompts} ({g.tokens} tokens)")  # fmt: skip
        return benched

    # ---- helpers --------------------------------------------------------------------------

    def write_train_config(self) -> None:
        """--train-config with :data:`LOOP_TRAINING` and the target built here."""

        raw = read_yaml_file(Path(self.s.train_config), "train config")
        if not isinstance(raw, dict) or not isinstance(raw.get("training"), dict):
            raise ConfigError(f"{self.s.train_config}: not a train config (no training section)")
        raw["training"].update(LOOP_TRAINING)
        raw.setdefault("target", {})["path"] = str(self.model_dir)
        self.train_yaml.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")

    def regen(self, argv: list[str]) -> int:
        """Run ``regen ARGV`` here, as typed (printed first); a regen error propagates."""

        self.show(shlex.join(["regen", *argv]))
        args = build_parser().parse_args(argv)
        return int(args._run(args) or 0)

    def step(self, text: str) -> None:
        self.console.rule(f"[bold]{text}", align="left")

    def show(self, command: str) -> None:
        self.console.print(f"[dim]$ {command}[/]", highlight=False, soft_wrap=True)

    def note(self, text: str) -> None:
        self.console.print(f"  {text}", highlight=False, soft_wrap=True)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt here (main thread only), so the servers' ``finally``
    blocks run; the previous handler comes back after."""

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _o(overrides: list[str]) -> list[str]:
    return [x for o in overrides for x in ("-o", o)]


def overlay_limits(path: Path) -> dict[str, int]:
    """``sources.NAME.limit`` of a reweight overlay."""
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return {
        name: int(spec["limit"])
        for name, spec in (data.get("sources") or {}).items()
        if isinstance(spec, dict) and "limit" in spec
    }


def bench_record(report: BenchReport, path: Path, start_s: float | None) -> BenchRecord:
    """The loop's summary of one bench report (the bench ran at temperature 0 with a
    concurrency-1 level: its greedy comparison is there)."""
    g = report.greedy
    if g is None:
        raise ConfigError(f"{path}: the bench compared no greedy answers (temperature 0 and "
                          "concurrency 1 are needed)")  # fmt: skip
    greedy = GreedyRecord(prompts=g.compared, identical=g.identical, tokens=g.tokens,
                          differing=g.differing)  # fmt: skip
    return BenchRecord(
        bench_json=str(path),
        prompts=report.settings.prompts,
        accept_length=report.acceptance.overall,
        sources={s.source: s.accept_length for s in report.sources},
        levels=[
            LevelRecord(
                concurrency=lv.concurrency,
                speedup=lv.speedup,
                baseline_tok_s=lv.baseline.output_tok_s,
                speculative_tok_s=lv.speculative.output_tok_s,
            )
            for lv in report.levels
        ],
        verdicts=[v.code for v in report.verdicts],
        greedy=greedy,
        start_s=None if start_s is None else round(start_s, 1),
    )


def run_loop(settings: LoopSettings, console: Any) -> LoopRecord:
    """Run the whole loop (module docstring); returns its record (also in loop.json)."""
    return Loop(settings, console).run()
