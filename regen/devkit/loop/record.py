"""The loop directory of ``regen demo --loop``: its names and ``loop.json``, the record of
every round's numbers (what the summary prints, what the tests read).

The loop directory (``--out``, default ``runs/demo-loop``) holds regen run directories and the
files between them; nothing in it is a run-directory file of its own (each ``round-N/`` is a
run directory, laid out by :mod:`regen.store.layout`)::

    OUT/
      loop.json                 LoopRecord: the settings, each round, the wall times
      train.yaml                the loop's train config: --train-config with LOOP_TRAINING
      logs/                     vllm-target.log, vllm-round-N.log, vllm-untrained.log,
                                export-round-N.log, export-untrained.log
      round-N/                  round N's regen run directory (its export with the held-out
                                prompts, train/ and train/cpu/ from the CPU training, bench/)
      round-N-draft/            SpecForge's export of round N's checkpoint
      round-N-draft-vllm/       its copy in vLLM's aux-layer numbering (regen serve-command)
      round-N-reweight.yaml     regen plan --reweight: the limits of round N + 1
      untrained-state.pt        SpecForge's EAGLE-3 draft at its initial weights, saved as a
                                training state for SpecForge's own exporter
      untrained-draft/, untrained-draft-vllm/, untrained-bench/
                                that draft exported, its vLLM copy, its bench on round 1's
                                held-out prompts

``loop.json`` is rewritten (atomically) after every round, so an interrupted loop keeps what
it measured.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from regen.store import RunDir

LOOP_JSON = "loop.json"
TRAIN_YAML = "train.yaml"
LOGS_DIR = "logs"
UNTRAINED = "untrained"
UNTRAINED_STATE = "untrained-state.pt"
#: where a round's bench goes inside its run directory (regen bench --run's default)
ROUND_BENCH = "bench"


def round_dir(out: Path, n: int) -> Path:
    """Round ``n``'s run directory."""
    return out / f"round-{n}"


def draft_dir(out: Path, name: str) -> Path:
    """Where SpecForge exports the draft of ``name`` (``round-N`` or ``untrained``)."""
    return out / f"{name}-draft"


def vllm_copy_dir(out: Path, name: str) -> Path:
    """The vLLM copy of that draft (``regen serve-command --engine vllm --vllm-draft-dir``)."""
    return out / f"{name}-draft-vllm"


def reweight_file(out: Path, n: int) -> Path:
    """The overlay ``regen plan --reweight`` writes after round ``n``: round n + 1's limits."""
    return out / f"round-{n}-reweight.yaml"


def untrained_bench_dir(out: Path) -> Path:
    return out / f"{UNTRAINED}-bench"


def log_file(out: Path, name: str) -> Path:
    return out / LOGS_DIR / f"{name}.log"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GreedyRecord(_Strict):
    """Every held-out prompt answered greedily by the target alone and with the draft."""

    prompts: int
    identical: int
    #: output tokens compared (the target's answers)
    tokens: int
    #: sample ids whose answers differ
    differing: list[str] = Field(default_factory=list)


class LevelRecord(_Strict):
    concurrency: int
    speedup: float | None
    baseline_tok_s: float
    speculative_tok_s: float


class BenchRecord(_Strict):
    """One bench of the loop (trained or untrained draft against the target alone)."""

    bench_json: str
    prompts: int
    #: 1 + accepted / drafts over the whole bench, from vLLM's counters
    accept_length: float | None
    #: per source, from the pass that sends that source's prompts alone
    sources: dict[str, float | None]
    levels: list[LevelRecord]
    #: the codes of the bench's verdicts, in its order (e.g. "draft-not-used")
    verdicts: list[str]
    greedy: GreedyRecord
    #: the speculative server's start time
    start_s: float | None = None


class RoundRecord(_Strict):
    round: int
    run_dir: str
    #: manifest overlays this round ran with (round 2: round 1's reweight overlay)
    overlays: list[str] = Field(default_factory=list)
    #: per-source limits of those overlays (empty: the manifest's)
    limits: dict[str, int] = Field(default_factory=dict)
    #: samples per source in the round's plan (after limits, filters and dedup)
    samples: dict[str, int] = Field(default_factory=dict)
    #: the export: rows read, rows trained on, samples held out for the bench
    rows_read: int
    rows_kept: int
    held_out: int
    #: held-out loss of the draft: (step, loss), step 0 being the untrained draft
    loss: list[tuple[int, float]]
    #: SpecForge's expected first-token acceptance on the held-out rows, per evaluation
    expected_accept: list[tuple[int, float]] = Field(default_factory=list)
    train_steps: int
    checkpoint: str
    draft: str
    draft_vllm: str
    bench: BenchRecord
    reweight: str | None = None
    #: seconds per step: regenerate, train, draft, serve, bench, reweight
    wall_s: dict[str, float] = Field(default_factory=dict)


class LoopRecord(_Strict):
    schema_version: int = 1
    created_at: str
    manifest: str
    train_config: str
    train_steps: int
    concurrency: list[int]
    per_source: int
    max_tokens: int
    num_speculative_tokens: int
    target_start_s: float | None = None
    rounds: list[RoundRecord] = Field(default_factory=list)
    untrained: BenchRecord | None = None
    wall_s: float | None = None


def write_record(out: Path, record: LoopRecord) -> None:
    RunDir.open(str(out)).write_text_atomic(LOOP_JSON, record.model_dump_json(indent=2) + "\n")


def read_record(out: Path) -> LoopRecord:
    return LoopRecord.model_validate_json((out / LOOP_JSON).read_text(encoding="utf-8"))
