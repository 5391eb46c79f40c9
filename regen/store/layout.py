"""The run directory's layout: one typed record, name, reader and writer per file.

This module is the only place that spells a file name of the run directory (a test greps the
code for any other). Everything below ``RUN_DIR`` (a local path or a pyarrow URI, see
:class:`regen.store.rundir.RunDir`)::

    RUN_DIR/
      run.json          RunRecord        the run: name, fingerprint, model, created_at,
                                         regen_version, endpoints, previous_fingerprints,
                                         engines (per endpoint: the engine, its version and
                                         where the rows' ids come from), settings (each
                                         settings id of its rows and what it stands for).
                                         Written by the driver
                                         at creation (regen.store.run.prepare_run); only
                                         ``--force`` rewrites the rest; ``engines`` is updated
                                         when a session meets an endpoint it did not record
                                         (regen.store.run.record_engines)
      manifest.yaml     regen.manifest.Manifest   the resolved manifest of the latest session
                                         (no secrets); driver, every session; read and written
                                         by regen.store.run (YAML, not a record)
      lock.json         LockRecord       the session holding the directory; driver
                                         (regen.store.lock), heartbeat every 5 s
      plan.json         PlanRecord       per-source totals of the current session; driver
                                         (regen.plan.session), once per session
      plan/index.json   PlanIndexRecord  the plan index: what decides the plan (key), the
                                         --limit it holds, each source file's signature, the
                                         sizes and sha256 of the files below; written last
      plan/samples.parquet               one row per planned sample in plan order: id, source,
                                         cost-model inputs, where its row lives
                                         (regen.store.planned.SCHEMA)
      plan/rows.parquet                  hub sources only: the planned samples themselves
                                         (JSON); driver (written by regen.plan.index, kept
                                         valid and read by regen.store.planned), when it reads
                                         the sources (first session, or the index is stale)
      checks.json       ChecksRecord     the key of the configuration checks an earlier session
                                         passed (tokenizer files, template, sources, versions)
                                         and the tokenizer's resolved class, for the actors;
                                         driver (regen.engine.failfast), when it changes
      progress.json     ProgressSnapshot the dashboard's counters (regen.store.progress);
                                         driver (regen.engine.tracker), every ~2 s and at the end
      schedule.json     ScheduleRecord   what the dispatch order learned; driver, with each part
      journal/SESSION-SEQ.jsonl          JournalLine per line, one per completed sample, flushed;
                                         driver (regen.store.segments.Journal); local
                                         filesystems only (object stores cannot append)
      parts/SESSION-SEQ.parquet          the rows of one segment (store.schema.SCHEMA), written as
                                         parts/.tmp-* and renamed; key-value metadata
                                         ``regen.samples`` / ``regen.engine.rows``
      parts/_SESSION-SEQ.json            PartRecord: row and sample counts, size and sha256 of
                                         the part's bytes, per-source counters; written right
                                         after its part (a part without one is verified by
                                         reading it, then gets one). The leading "_" makes
                                         Parquet dataset readers (pyarrow, pandas, Spark) skip
                                         it: parts/ still reads as one dataset
      failures/SESSION.jsonl             FailureRecord per line; driver (regen.store.failures)
      quarantine/NAME                    damaged parts (and their records) moved aside by the
                                         driver on resume or by ``regen verify --repair``
      export/                            ``regen train``'s export: shard-NNNNN.jsonl +
                                         stats.json (ExportStats); regen.export; with
                                         ``--holdout N`` also holdout.jsonl (the held-out
                                         prompts ``regen bench --run`` sends,
                                         regen.store.holdout)
      train/            train.yaml, draft_config.json, run.yaml, prompts.jsonl,
                        vocab_mapping.pt + vocab_mapping.json (VocabMappingRecord),
                        run_tokenizer.json (TokenizerRecord: the run's tokenizer facts),
                        specforge_plan.json (SpecForge's launch plan of run.yaml),
                        command.json (CommandRecord), job.json (JobRecord),
                        preflight.json (PreflightRecord), control/   regen.train
      train/cpu/        ``regen demo --train`` only: run.yaml, features/, eval-features/
                        (SpecForge offline hidden states), train.log, curve.json
                        (CpuCurveRecord), checkpoints/   regen.devkit.cpu_train

Any export directory (``regen export --out DIR``) has the export's shard and stats names.

Readers return ``None`` for a missing file. A file that exists but does not parse or does not
match its record is a :class:`regen.core.errors.RunDirError` naming the file, except for the
snapshots that are only estimates or shortcuts (``schedule.json``, ``checks.json``), which read as
``None`` with a warning.
Writers replace the file atomically (:meth:`regen.store.rundir.RunDir.write_bytes_atomic`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from regen.core.errors import RunDirError
from regen.manifest import Export
from regen.quality.config import NO_LOOP_CUT, LoopCut
from regen.store.counts import SourceCounts
from regen.store.progress import ProgressSnapshot
from regen.store.rundir import TMP_PREFIX, RunDir

log = logging.getLogger(__name__)

# ---- names ---------------------------------------------------------------------------------

RUN = "run.json"
MANIFEST = "manifest.yaml"
LOCK = "lock.json"
#: held (exclusive create) by the one session taking a stale lock over, for that moment only
LOCK_TAKEOVER = f"{LOCK}.takeover"
PLAN = "plan.json"
CHECKS = "checks.json"
PLAN_DIR = "plan"
PLAN_INDEX = f"{PLAN_DIR}/index.json"
PLAN_SAMPLES = f"{PLAN_DIR}/samples.parquet"
PLAN_ROWS = f"{PLAN_DIR}/rows.parquet"
PROGRESS = "progress.json"
SCHEDULE = "schedule.json"
JOURNAL_DIR = "journal"
PARTS_DIR = "parts"
FAILURES_DIR = "failures"
QUARANTINE_DIR = "quarantine"
EXPORT_DIR = "export"
TRAIN_DIR = "train"
TRAIN_YAML = f"{TRAIN_DIR}/train.yaml"
DRAFT_CONFIG = f"{TRAIN_DIR}/draft_config.json"
RUN_YAML = f"{TRAIN_DIR}/run.yaml"
PROMPTS = f"{TRAIN_DIR}/prompts.jsonl"
COMMAND = f"{TRAIN_DIR}/command.json"
JOB = f"{TRAIN_DIR}/job.json"
PREFLIGHT = f"{TRAIN_DIR}/preflight.json"
CONTROL_DIR = f"{TRAIN_DIR}/control"
#: one SpecForge control directory per launch attempt (its planner wants a fresh one)
CONTROL_ATTEMPT_GLOB = "attempt-*"
VOCAB_MAPPING = f"{TRAIN_DIR}/vocab_mapping.pt"
VOCAB_MAPPING_RECORD = f"{TRAIN_DIR}/vocab_mapping.json"
TOKENIZER_RECORD = f"{TRAIN_DIR}/run_tokenizer.json"
SPECFORGE_PLAN = f"{TRAIN_DIR}/specforge_plan.json"
#: ``regen demo --train`` only: SpecForge's CPU run on captured hidden states
CPU_TRAIN_DIR = f"{TRAIN_DIR}/cpu"
CPU_RUN_YAML = f"{CPU_TRAIN_DIR}/run.yaml"
CPU_FEATURES = f"{CPU_TRAIN_DIR}/features"
CPU_EVAL_FEATURES = f"{CPU_TRAIN_DIR}/eval-features"
CPU_TRAIN_LOG = f"{CPU_TRAIN_DIR}/train.log"
CPU_CURVE = f"{CPU_TRAIN_DIR}/curve.json"
CPU_CHECKPOINTS = f"{CPU_TRAIN_DIR}/checkpoints"
#: the stats file of an export directory (``regen export --out DIR`` and ``RUN_DIR/export``)
EXPORT_STATS = "stats.json"
#: the held-out prompts of an export directory (``regen export --holdout N``)
HOLDOUT = "holdout.jsonl"
#: shard name prefix per export format
SHARD_PREFIX: dict[str, str] = {"pretokenized": "shard-", "conversations": "conversations-"}
#: temporary names start with TMP_PREFIX (regen.store.rundir: never read, removed when left over)
PART_SUFFIX = ".parquet"
RECORD_PREFIX = "_"
RECORD_SUFFIX = ".json"
SEGMENT_SUFFIX = ".jsonl"


def part_path(stem: str) -> str:
    """``parts/STEM.parquet``."""
    return f"{PARTS_DIR}/{stem}{PART_SUFFIX}"


def part_record_path(stem: str) -> str:
    """``parts/_STEM.json``: the part's :class:`PartRecord`."""
    return f"{PARTS_DIR}/{RECORD_PREFIX}{stem}{RECORD_SUFFIX}"


def part_stem(name: str) -> str | None:
    """The stem of a part file name (``S-00001.parquet`` → ``S-00001``); None otherwise."""
    if name.startswith(TMP_PREFIX) or not name.endswith(PART_SUFFIX):
        return None
    return name[: -len(PART_SUFFIX)]


def record_stem(name: str) -> str | None:
    """The stem of a part record file name (``_S-00001.json`` → ``S-00001``); None otherwise."""
    if not (name.startswith(RECORD_PREFIX) and name.endswith(RECORD_SUFFIX)):
        return None
    return name[len(RECORD_PREFIX) : -len(RECORD_SUFFIX)]


def segment_path(stem: str) -> str:
    """``journal/STEM.jsonl``."""
    return f"{JOURNAL_DIR}/{stem}{SEGMENT_SUFFIX}"


def segment_stem(name: str) -> str | None:
    """The stem of a journal segment file name; None for anything else."""
    if name.startswith(TMP_PREFIX) or not name.endswith(SEGMENT_SUFFIX):
        return None
    return name[: -len(SEGMENT_SUFFIX)]


def failures_path(session: str) -> str:
    """``failures/SESSION.jsonl``."""
    return f"{FAILURES_DIR}/{session}{SEGMENT_SUFFIX}"


def is_failures_log(name: str) -> bool:
    return not name.startswith(TMP_PREFIX) and name.endswith(SEGMENT_SUFFIX)


def quarantine_path(rel: str) -> str:
    """Where a damaged file ``rel`` is moved: ``quarantine/`` + its path with '/' → '__'."""
    return f"{QUARANTINE_DIR}/{rel.strip('/').replace('/', '__')}"


def shard_name(fmt: str, index: int) -> str:
    """``shard-00000.jsonl`` (pretokenized) or ``conversations-00000.jsonl``."""
    return f"{SHARD_PREFIX[fmt]}{index:05d}{SEGMENT_SUFFIX}"


def is_shard(fmt: str, name: str) -> bool:
    return name.startswith(SHARD_PREFIX[fmt]) and name.endswith(SEGMENT_SUFFIX)


# ---- records -------------------------------------------------------------------------------


class Record(BaseModel):
    """A JSON record of the run directory: unknown keys refused, so damage is seen."""

    model_config = ConfigDict(extra="forbid")


class EngineRecord(Record):
    """One endpoint's engine, as a session's endpoint check recognised it."""

    #: the engine profile (regen.client.profiles): "sglang", "vllm", "openai"
    engine: str
    #: the version the server reported (None: none)
    version: str | None = None
    #: where the rows' ids come from: "sglext", "sglang_nonstream", "vllm_stream",
    #: "vllm_nonstream" (the server's own ids) or "local" (rendered and tokenized here)
    token_path: str
    #: the session that recorded it last
    session: str | None = None


class RunRecord(Record):
    """``run.json``: which run this directory holds."""

    #: the manifest's name
    name: str
    #: Manifest.fingerprint() of the manifest the directory is bound to
    fingerprint: str
    #: the served model name
    model: str
    #: epoch seconds when the directory was created
    created_at: float
    #: regen version that created it
    regen_version: str
    #: endpoint URLs of the first session (without user:password)
    endpoints: list[str] = Field(default_factory=list)
    #: fingerprints replaced by ``--force``, oldest first
    previous_fingerprints: list[str | None] = Field(default_factory=list)
    #: endpoint URL (without user:password) -> its engine, as sessions found it
    engines: dict[str, EngineRecord] = Field(default_factory=dict)
    #: every settings id its sessions answered with (the rows' ``settings`` column,
    #: ``Manifest.settings_id()``) -> those settings as dotted fields (``sampling.temperature``:
    #: 0.6, ...): what each id of a ``--force`` mix stands for
    settings: dict[str, dict[str, object]] = Field(default_factory=dict)
    #: how the local render hands history tool-call arguments to the chat template:
    #: ``objects``, as the engines do (every run made since regen rendered so), ``strings``,
    #: as regen did before (a run.json without the field): a run keeps what it started with
    render: Literal["objects", "strings"] = "strings"
    #: the loop cut the run started with (``quality.loop_cut``, regen.quality.loop): a run
    #: keeps it; a run.json from before the cut existed records none (no cut)
    loop_cut: LoopCut = NO_LOOP_CUT


class LockRecord(Record):
    """``lock.json``: the session that holds the directory."""

    #: what holds it ("regen run")
    owner: str = "regen run"
    #: hostname of the holder
    host: str
    #: pid of the holder on ``host``
    pid: int
    #: the holder's session id
    session: str
    #: epoch seconds when the session took the lock
    started_at: float
    #: epoch seconds of the last heartbeat (the holder's clock)
    heartbeat_at: float

    def age(self, now: float | None = None) -> float:
        """Seconds since the last heartbeat."""
        return (time.time() if now is None else now) - self.heartbeat_at


class PlanEntry(Record):
    """One source in ``plan.json``."""

    #: samples of the source in this session's plan (after filters, dedup, limits)
    total: int
    #: True when the source is regenerated (False: native rows)
    regenerate: bool
    #: native samples still to store
    native: int = 0
    #: samples still to regenerate
    regenerate_todo: int = 0
    #: requests those need (the ETA's turns per sample)
    regenerate_turns: int = 0


class PlanRecord(Record):
    """``plan.json``: per-source totals of the current session."""

    #: {source name: its entry}, in manifest order
    sources: dict[str, PlanEntry] = Field(default_factory=dict)
    #: the session that planned
    session: str = ""
    #: epoch seconds
    planned_at: float = 0.0
    #: absolute folder of the manifest that session loaded (its relative paths resolve there)
    manifest_dir: str = ""
    #: that session's ``--limit`` (the plan keeps the first N samples)
    limit: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: object) -> object:
        """Drivers before this record wrote ``{source: entry}`` at the top level."""
        if not isinstance(data, dict) or not data or "sources" in data:
            return data
        return {"sources": data} if all(isinstance(v, dict) for v in data.values()) else data


class IndexedSource(Record):
    """One source in ``plan/index.json``: where its rows were read and what the file was."""

    #: "jsonl" or "parquet" (a local file, its rows read where they are) or "hub" (the
    #: planned samples are kept in plan/rows.parquet)
    kind: Literal["jsonl", "parquet", "hub"]
    #: absolute path of the local file ("" for hub)
    path: str = ""
    #: its size in bytes
    size: int = 0
    #: its modification time (ns)
    mtime_ns: int = 0
    #: sha256 of its first and last 64 KiB (regen.sources.locate.file_signature)
    head_tail: str = ""


class IndexedFile(Record):
    """A data file of the plan index, as written."""

    #: its size
    bytes: int
    #: sha256 of its bytes ("" for plan/rows.parquet: its size is checked, and each row it
    #: gives back is checked against its content hash when read)
    sha256: str = ""


class PlanIndexRecord(Record):
    """``plan/index.json``: which samples the plan holds and how to know it still does."""

    #: regen.store.planned.INDEX_VERSION of the writer
    version: int
    #: hash of everything that decides which samples are planned (sources, dedup, the native
    #: check's tokenizer, regen's version); one component per entry of ``keys``
    key: str
    #: the components of ``key`` (to name the one that changed)
    keys: dict[str, str] = Field(default_factory=dict)
    #: the --limit the stream was cut at (None: read to the end)
    limit: int | None = None
    #: the stream ended before any limit: every later --limit is a prefix of these samples
    complete: bool = False
    #: entries in plan/samples.parquet (stream items, repeated ids included)
    samples: int = 0
    #: {source name: its file signature or hub}, in manifest order
    sources: dict[str, IndexedSource] = Field(default_factory=dict)
    #: {file name (plan/samples.parquet, plan/rows.parquet): size and sha256}
    files: dict[str, IndexedFile] = Field(default_factory=dict)
    #: epoch seconds
    built_at: float = 0.0
    #: regen version that wrote it
    regen_version: str = ""


class ChecksRecord(Record):
    """``checks.json``: the configuration checks a session passed (regen.engine.failfast)."""

    #: regen.engine.failfast.checks_key of what was checked
    key: str
    #: epoch seconds
    checked_at: float = 0.0
    #: the target tokenizer's class as AutoTokenizer resolved it
    #: (regen.template.tokenizer.class_spec; None: not known): the actors load it by its class
    tokenizer_class: str | None = None


class ScheduleSource(Record):
    """One source of ``schedule.json`` (see regen.engine.schedule.SourceLengths)."""

    turns: int
    tokens: float
    n: int
    sx: float
    sy: float
    sxx: float
    sxy: float


class ScheduleRecord(Record):
    """``schedule.json``: the dispatch order's learned per-source lengths."""

    version: int = 1
    sources: dict[str, ScheduleSource] = Field(default_factory=dict)


class PartRecord(Record):
    """``parts/STEM.json``: what a part holds and how to know it is intact."""

    #: the part's stem (its file is parts/STEM.parquet)
    stem: str
    #: rows in the part (also in the Parquet footer)
    rows: int
    #: distinct samples in the part
    samples: int
    #: size of the part's file in bytes
    bytes: int
    #: sha256 of the part's bytes (hex)
    sha256: str
    #: per-source counters of the part's samples
    sources: dict[str, SourceCounts] = Field(default_factory=dict)
    #: epoch seconds
    written_at: float = 0.0


class JournalLine(Record):
    """One line of ``journal/SESSION-SEQ.jsonl``: a completed sample and all its rows."""

    sample_id: str
    source: str
    rows: list[dict[str, Any]]
    #: a new attempt: the counters of the answer it replaces (None: the sample's first answer)
    replaces: SourceCounts | None = None


class FailureRecord(Record):
    """One line of ``failures/SESSION.jsonl``: why a sample could not be completed."""

    sample_id: str
    source: str
    #: RegenError.kind of the last error
    kind: str
    #: HTTP status, when there was one
    status: int | None
    message: str
    attempts: int
    #: permanent ones are skipped on resume unless --retry-failed
    permanent: bool
    at: float


class FlagStats(BaseModel):
    """Rows dropped for one quality flag (stats.json ``flags``)."""

    rows: int = 0
    tokens: int = 0
    loss_tokens: int = 0

    def add(self, tokens: int, loss_tokens: int) -> None:
        self.rows += 1
        self.tokens += tokens
        self.loss_tokens += loss_tokens


class SourceExportStats(BaseModel):
    """Per-source numbers of an export (stats.json ``sources``)."""

    rows_read: int = 0
    rows: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    truncated_seen: int = 0
    holdout_samples: int = 0  #: samples held out for the bench
    dropped: dict[str, int] = Field(default_factory=dict)
    #: rows, tokens and loss tokens dropped per quality flag (with only_flagged: written)
    flags: dict[str, FlagStats] = Field(default_factory=dict)
    #: loss tokens / tokens of the written rows (set with them)
    mask_coverage: float = 0.0


#: the formats of an export: SpecForge's pre-tokenized rows, or the raw conversations
ExportFormat = Literal["pretokenized", "conversations"]


class ExportChoices(Export):
    """The settings of one export that its stats.json records: the manifest's ``export:``
    section (regen.manifest.Export) and what one export chooses for itself."""

    #: ``pretokenized`` {input_ids, loss_mask} or ``conversations``
    format: ExportFormat = "pretokenized"
    #: write only the latest answers' rows carrying a flag of ``drop_flags`` (inspection)
    only_flagged: bool = False
    #: keep only the rows of this settings id, and native rows (run.json lists the run's)
    setting: str | None = None


class ExportStats(ExportChoices):
    """``stats.json`` of an export directory: what ``regen export`` kept and dropped, and the
    settings that decided it (:class:`ExportChoices`; regen.export; read back by ``regen
    train`` and the CLI). Its keys go in :data:`EXPORT_STATS_KEYS`' order; unknown keys of a
    file written by another version are kept as written, after them."""

    model_config = ConfigDict(extra="allow", frozen=False)

    run_dir: str
    out: str
    rows_written: int = 0
    shards: list[dict[str, str | int]] = Field(default_factory=list)  #: {file, rows, tokens}
    rows_read: int = 0
    #: rows dropped per reason (all sources)
    dropped: dict[str, int] = Field(default_factory=dict)
    parts: int = 0
    tokens: int = 0  #: tokens of the written rows
    loss_tokens: int = 0  #: tokens with loss_mask 1 in the written rows
    sources: dict[str, SourceExportStats] = Field(default_factory=dict)
    token_source: dict[str, int] = Field(default_factory=dict)  #: written rows per source kind
    token_check: dict[str, int] = Field(default_factory=dict)  #: read rows per check result
    token_check_problems: int = 0  #: read rows whose check is not one of the accepted
    #: written rows per settings id of the row ("native" for native rows, "unknown" for rows
    #: written before the column): the mix a ``regen run --force`` left
    settings: dict[str, int] = Field(default_factory=dict)
    holdout_samples: int = 0  #: samples held out, all sources
    holdout_file: str | None = None  #: holdout.jsonl when written
    #: rows, tokens and loss tokens dropped per quality flag (with only_flagged: written)
    flags: dict[str, FlagStats] = Field(default_factory=dict)
    #: loss tokens / tokens of the written rows (set with them)
    mask_coverage: float = 0.0
    #: when the export was written (ISO-8601 UTC, seconds)
    created_at: str | None = None

    @classmethod
    def of(cls, run_dir: str, out: str, choices: ExportChoices) -> ExportStats:
        """The stats of an export of ``run_dir`` to ``out`` about to be written with
        ``choices`` (and nothing counted yet)."""
        return cls(run_dir=run_dir, out=out,
                   **choices.model_dump(include=set(ExportChoices.model_fields)))  # fmt: skip

    @model_validator(mode="before")
    @classmethod
    def _written_before_flags(cls, data: object) -> object:
        """A stats.json without ``drop_flags`` was written before quality flags: it dropped
        none."""
        if isinstance(data, dict) and "drop_flags" not in data:
            return {**data, "drop_flags": []}
        return data

    @model_serializer(mode="wrap")
    def _in_file_order(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """The keys in :data:`EXPORT_STATS_KEYS`' order (the settings come from the base
        model, the report from this one: the file interleaves them), then any other."""
        data: dict[str, object] = handler(self)
        ordered = {k: data.pop(k) for k in EXPORT_STATS_KEYS if k in data}
        return {**ordered, **data}


#: stats.json's keys, in the order the file has them: the report and the settings between
EXPORT_STATS_KEYS = (
    "run_dir", "out", "format", "rows_written", "shards", "holdout", "rows_read", "dropped",
    "seed", "drop_truncated", "max_length", "shard_rows", "drop_flags", "only_flagged",
    "keep_unproven", "parts", "tokens", "loss_tokens", "sources", "token_source", "token_check",
    "token_check_problems", "setting", "settings", "holdout_samples", "holdout_file", "flags",
    "mask_coverage", "created_at",
)  # fmt: skip


class CommandRecord(Record):
    """``train/command.json``: what the training job runs."""

    argv: list[str]
    exec_argv: list[str]
    entrypoint: str
    gpus: int
    run_yaml: str
    prompts_path: str


class VocabMappingRecord(Record):
    """``train/vocab_mapping.json``: how ``train/vocab_mapping.pt`` was built
    (regen.train.vocab)."""

    path: str
    sha256: str
    #: the pre-tokenized rows counted (SpecForge's data.prompts_path)
    prompts_path: str
    rows: int
    #: loss-masked tokens counted
    loss_tokens: int
    #: distinct token ids among them
    distinct_ids: int
    vocab_size: int
    draft_vocab_size: int
    #: share of the loss tokens whose id is in the draft vocabulary
    coverage: float


class TokenizerRecord(Record):
    """``train/run_tokenizer.json``: the run's tokenizer as the training checks compare it
    (regen.train.target)."""

    #: where it was loaded from
    path: str
    vocab_size: int
    #: Kimi special token -> id (None: the tokenizer lacks it)
    special_ids: dict[str, int | None]
    #: the chat template's token ids for the probe conversation (None: no template)
    probe_ids: list[int] | None = None


class SpecForgePlanRecord(Record):
    """``train/specforge_plan.json``: SpecForge's own launch plan of ``train/run.yaml``."""

    #: "submit" (regen train, before submitting) or "cluster" (the job's preflight)
    where: str
    at: float
    #: SpecForge's plan kind and role ("supervisor", "both" for a disaggregated run)
    kind: str
    role: str
    #: the plan as ``specforge train --plan`` prints it
    plan: dict[str, object]


class CpuCurveRecord(Record):
    """``train/cpu/curve.json``: the loss curve of ``regen demo --train`` (SpecForge on CPU)."""

    steps: int
    #: (step, training loss) per logged step
    train: list[tuple[int, float]]
    #: (step, held-out loss); step 0 is the untrained draft
    held_out: list[tuple[int, float]]
    #: (step, SpecForge's expected acceptance of the first drafted token on the held-out
    #: rows, ``eval/acceptance_rate_0``) at the same steps
    held_out_acceptance: list[tuple[int, float]] = Field(default_factory=list)
    checkpoint: str | None


class JobState(Record):
    state: str
    at: float


class JobRecord(Record):
    """``train/job.json``: the submitted training job and every state it went through."""

    submission_id: str | None = None
    address: str | None = None
    entrypoint: str | None = None
    entrypoint_num_gpus: int | None = None
    submitted_at: float | None = None
    state: str | None = None
    message: str | None = None
    updated_at: float | None = None
    history: list[JobState] = Field(default_factory=list)


class PreflightRecord(BaseModel):
    """``train/preflight.json``: written on the cluster by regen.train.preflight."""

    model_config = ConfigDict(extra="allow")

    ok: bool
    host: str
    at: float
    #: a failed preflight: why, and the trap it fell into (regen.train.traps; None: another
    #: error)
    error: str | None = None
    trap: str | None = None
    #: a passed one: the node's GPUs, the rows scanned, those SpecForge's prompt builder
    #: keeps, their loss tokens, the run.yaml, SpecForge's plan of it ({kind, role}) and the
    #: command it then runs (as command.json has it)
    cuda_visible_devices: str | None = None
    rows: int | None = None
    prepared: int | None = None
    loss_tokens: int | None = None
    run_yaml: str | None = None
    specforge_plan: dict[str, str] | None = None
    argv: list[str] = Field(default_factory=list)
    exec_argv: list[str] = Field(default_factory=list)


# ---- files ---------------------------------------------------------------------------------

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class JsonFile(Generic[M]):
    """A JSON file of the run directory: its relative name and its record type."""

    name: str
    model: type[M]
    #: an estimate: unreadable reads as None with a warning instead of an error
    lenient: bool = False

    def exists(self, rd: RunDir) -> bool:
        return rd.exists(self.name)

    def read(self, rd: RunDir) -> M | None:
        """The record, or None when the file is missing (or, if lenient, unreadable)."""
        data = rd.read_bytes(self.name)
        if data is None:
            return None
        try:
            return self.parse(data)
        except RunDirError as e:
            if self.lenient:
                log.warning("%s ignored: %s", self.name, e)
                return None
            raise

    def parse(self, data: bytes) -> M:
        try:
            return self.model.model_validate_json(data)
        except ValidationError as e:
            errors = e.errors()
            where = ".".join(str(x) for x in errors[0]["loc"]) if errors else ""
            what = errors[0]["msg"] if errors else str(e)
            raise RunDirError(f"{self.name} is damaged: {where or '(top level)'}: {what}") from None

    def write(self, rd: RunDir, record: M) -> None:
        """Replace the file atomically with ``record``."""
        rd.write_bytes_atomic(self.name, dump_json(record))


def dump_json(record: BaseModel | Mapping[str, object]) -> bytes:
    """The bytes regen writes for a JSON record (indented, UTF-8)."""
    obj = record.model_dump(mode="json") if isinstance(record, BaseModel) else record
    return json.dumps(obj, ensure_ascii=False, indent=1).encode()


RUN_FILE = JsonFile(RUN, RunRecord)
LOCK_FILE = JsonFile(LOCK, LockRecord)
PLAN_FILE = JsonFile(PLAN, PlanRecord)
PLAN_INDEX_FILE = JsonFile(PLAN_INDEX, PlanIndexRecord)
CHECKS_FILE = JsonFile(CHECKS, ChecksRecord, lenient=True)
SCHEDULE_FILE = JsonFile(SCHEDULE, ScheduleRecord, lenient=True)
COMMAND_FILE = JsonFile(COMMAND, CommandRecord)
JOB_FILE = JsonFile(JOB, JobRecord)
PREFLIGHT_FILE = JsonFile(PREFLIGHT, PreflightRecord)
EXPORT_STATS_FILE = JsonFile(EXPORT_STATS, ExportStats)
PROGRESS_FILE = JsonFile(PROGRESS, ProgressSnapshot)
VOCAB_MAPPING_FILE = JsonFile(VOCAB_MAPPING_RECORD, VocabMappingRecord)
TOKENIZER_FILE = JsonFile(TOKENIZER_RECORD, TokenizerRecord)
SPECFORGE_PLAN_FILE = JsonFile(SPECFORGE_PLAN, SpecForgePlanRecord)
CPU_CURVE_FILE = JsonFile(CPU_CURVE, CpuCurveRecord)


def control_attempt(n: int) -> str:
    """``train/control/attempt-NNN``: SpecForge's control directory of launch attempt ``n``."""
    return f"{CONTROL_DIR}/attempt-{n:03d}"


def part_record_file(stem: str) -> JsonFile[PartRecord]:
    """The record file of part ``stem``."""
    return JsonFile(part_record_path(stem), PartRecord)
