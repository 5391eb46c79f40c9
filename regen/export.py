"""Export a run directory's rows for SpecForge.

First the cheap check of the run directory (:func:`regen.store.verify.refuse_damaged`: each
part's footer against its record; skipped with ``check=False`` by a caller that ran it on the
same handle, ``regen train``); a damaged directory is refused with one line pointing to
``regen verify --repair``. Then reads every Parquet part of the run directory (schema
``regen.store.schema.SCHEMA``; names in :mod:`regen.store.layout`) through its pyarrow
filesystem, and writes to ``OUT`` (local path or pyarrow URI; file names from the layout
too)::

    OUT/
      shard-00000.jsonl ...        fmt="pretokenized": one {"input_ids": [...], "loss_mask": [...]}
                                   per line (compact JSON), SpecForge's ``data.prompts_path``
      conversations-00000.jsonl    fmt="conversations": {"id", "conversations": [...], "tools"?}
                                   per line, SpecForge's ``data.train_data_path``
      stats.json                   what was kept and dropped, rows and tokens per source
      holdout.jsonl                with ``holdout`` N > 0: the held-out samples' prompts for
                                   ``regen bench`` (regen.bench.prompts format); removed by
                                   an export without a holdout

Rules, in this order: only each sample's latest answer counts (rows of an earlier attempt,
kept in the run directory when ``regen run --retry-flagged`` or a changed source row answered
the sample again, are dropped as ``superseded``); only the samples of the latest plan count,
each with the content it planned (regen.store.stale: the rows of a sample the plan no longer
holds are dropped as ``not_planned``, those whose ``content_hash`` is not the planned one as
``stale``: both answer a source row that was edited or left the plan); with ``setting`` ID,
only the rows that settings id made (the ``settings`` column; ``regen run --force`` can mix
settings) and native rows (no setting makes them) count, the others are dropped as
``other_setting``; rows are deduplicated by (sample_id, turn, attempt) (first in
part-name order wins); every row of a held-out sample is dropped (below); rows carrying a
quality flag of ``drop_flags`` are dropped as ``flagged`` (default
:data:`regen.quality.DEFAULT_DROP_FLAGS`; stats.json counts rows, tokens and loss tokens per
flag, a row with two such flags under each); a locally rendered row whose ``token_check``
cannot show it is the model's tokens (not ``count_match``: a rebuilt tool call, a count that
differs or is unknown, a guessed ``</think>``) is dropped as ``unproven_tokens`` unless
``keep_unproven`` (server-id rows always are the model's tokens); then truncated rows
(finish_reason "length") are dropped unless kept, rows longer than ``max_length`` tokens are
dropped (never cut: a cut row would change its mask), rows without a single loss token are
dropped (SpecForge would skip them silently). Parts written before the attempt and quality
columns read as attempt 0 without flags.

``only_flagged`` inverts the flag rule for inspection: only the latest answers' rows carrying a
flag of ``drop_flags`` are written (nothing else is dropped), and the conversations variant
writes one record per such row (not per sample), with its ``turn``, ``attempt`` and
``quality_flags``. Dropped rows always stay in the run directory. The kept rows are sorted by
(sample_id, turn) and shuffled with ``random.Random(seed)``, so the output depends only on the
rows and the seed, never on part order. Shards are consecutive slices of that one order:
concatenating them in name order gives the single file SpecForge 0.2.0 reads
(``data.prompts_path`` is one path); ``shard_rows=0`` writes one shard. Native rows come out
byte-identical to their input ids and mask. Earlier shards of the same format in OUT are removed.

Memory stays bounded at any run size: only the key columns (sample id, turn, source, lengths,
flags) of all rows are held to decide dedup, drops and order; the heavy columns are then read
one Parquet row group at a time and each kept row's JSON line is spilled to a local temporary
bucket file by its output position (``WINDOW_ROWS`` positions per bucket), and the shards are
written bucket by bucket through an output stream (temp name, then rename). Each part is read
twice (keys, then data) and nothing else (with a holdout, the row groups holding the held-out
first turns once more, for their messages).

**Held-out samples** (``holdout`` N): per source, the N samples with the smallest
:func:`holdout_rank` (a sha256 of the seed and the sample id: the same samples on every machine
and every re-export of the same rows, whatever their order) are kept out of the shards, all
their turns. Each becomes one line of ``holdout.jsonl``: the request of its first regenerated
turn exactly as the run sent it (system prompt, user message, tools; for a sample whose first
regenerated turn is a later one, the dataset's history before it). Later turns are not sent
to the bench: their history holds this target's own earlier answers, and one prompt per sample
keeps every sample's weight in its source's acceptance equal (a sample answered more than once
is held out by its latest answer's rows). Native sources (pre-tokenized
rows, no messages to send) are not held out; a source keeps at least half of its samples for
training (a warning says when that cuts its holdout below N).

The conversations variant has one record per sample (its highest kept turn): the request
messages of that turn plus the regenerated assistant message, with ``reasoning_content`` on
assistant messages (SpecForge's thinking parser reads it; its default parser keeps only role,
content and tool_calls, and its template route drops history reasoning and inserts its own
default system prompt, so prefer the pre-tokenized export). Native rows cannot be expressed as
conversations and are counted as ``not_convertible``.
"""

from __future__ import annotations

import json
import logging
import random
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from regen.errors import ConfigError, RunDirError
from regen.quality import DEFAULT_DROP_FLAGS, parse_flags
from regen.sample import stable_hash
from regen.store import layout
from regen.store.run import read_manifest_data
from regen.store.rundir import RunDir
from regen.store.schema import ADDED_COLUMNS, ANSWER_COLUMNS

log = logging.getLogger(__name__)

Format = Literal["pretokenized", "conversations"]
FORMATS: tuple[str, ...] = ("pretokenized", "conversations")
#: token_check values that are not a problem (regen.rows); every other value is counted as one
TOKEN_CHECKS_OK = frozenset({"match", "count_match", "server_only"})
#: the drop reason of a locally rendered row whose token_check is not in TOKEN_CHECKS_OK: its
#: tokens cannot be shown to be the ones the model produced (a server-id row always is)
UNPROVEN = "unproven_tokens"
#: drop reasons that lose no training data: another attempt or copy of the row is kept, or the
#: bench keeps the sample; every other reason counts towards :func:`drop_share`
KEPT_ELSEWHERE = frozenset({"superseded", "duplicate", "holdout"})
#: the settings of an export that decide which rows it keeps (stats.json records each)
ROW_SETTINGS = ("seed", "drop_truncated", "max_length", "holdout", "drop_flags", "keep_unproven")

_KEY_COLUMNS = (
    "sample_id",
    "source",
    "turn",
    "truncated",
    "num_tokens",
    "loss_tokens",
    "token_source",
    "token_check",
    "attempt",
    "quality_flags",
    "content_hash",
    "settings",
)
_DATA_COLUMNS: dict[str, tuple[str, ...]] = {
    "pretokenized": ("input_ids", "loss_mask"),
    "conversations": (
        "sample_id",
        "turn",
        "messages",
        "tools",
        "reasoning",
        "content",
        "tool_calls",
        "attempt",
        "quality_flags",
    ),
}
#: output positions per spill bucket (a bucket's lines are held in memory while it is written)
WINDOW_ROWS = 4096
#: at most this many spill buckets (open files) at once; windows grow for huge exports
MAX_BUCKETS = 256


@dataclass(slots=True)
class _Part:
    """One Parquet part: where its rows start in the global row numbering, its row groups."""

    name: str
    path: str
    start: int
    group_rows: list[int]


@dataclass(slots=True)
class FlagStats:
    """Rows dropped for one quality flag (stats.json ``flags``)."""

    rows: int = 0
    tokens: int = 0
    loss_tokens: int = 0

    def add(self, tokens: int, loss_tokens: int) -> None:
        self.rows += 1
        self.tokens += tokens
        self.loss_tokens += loss_tokens


@dataclass(slots=True)
class SourceExportStats:
    """Per-source numbers in stats.json."""

    rows_read: int = 0
    rows: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    truncated_seen: int = 0
    holdout_samples: int = 0  #: samples held out for the bench
    dropped: dict[str, int] = field(default_factory=dict)
    #: rows, tokens and loss tokens dropped per quality flag (with only_flagged: written)
    flags: dict[str, FlagStats] = field(default_factory=dict)

    @property
    def mask_coverage(self) -> float:
        return self.loss_tokens / self.tokens if self.tokens else 0.0


@dataclass(slots=True)
class ExportStats:
    """What an export kept and dropped; written as OUT/stats.json."""

    run_dir: str
    out: str
    format: str
    seed: int
    drop_truncated: bool
    max_length: int | None
    shard_rows: int
    holdout: int = 0  #: samples per source held out (the setting)
    drop_flags: list[str] = field(default_factory=list)  #: quality flags whose rows are dropped
    only_flagged: bool = False  #: only the rows carrying one of them were written
    #: local rows whose token_check cannot show they are the model's tokens were kept (the
    #: setting); otherwise they are dropped as ``unproven_tokens``
    keep_unproven: bool = False
    parts: int = 0
    rows_read: int = 0
    rows_written: int = 0
    tokens: int = 0  #: tokens of the written rows
    loss_tokens: int = 0  #: tokens with loss_mask 1 in the written rows
    dropped: dict[str, int] = field(default_factory=dict)
    sources: dict[str, SourceExportStats] = field(default_factory=dict)
    token_source: dict[str, int] = field(default_factory=dict)  #: written rows per source kind
    token_check: dict[str, int] = field(default_factory=dict)  #: read rows per check result
    token_check_problems: int = 0  #: read rows whose check is not in TOKEN_CHECKS_OK
    #: the settings id kept (``setting``; None: every setting)
    setting: str | None = None
    #: written rows per settings id of the row ("native" for native rows, "unknown" for rows
    #: written before the column): the mix a ``regen run --force`` left
    settings: dict[str, int] = field(default_factory=dict)
    shards: list[dict[str, Any]] = field(default_factory=list)  #: {file, rows, tokens}
    holdout_samples: int = 0  #: samples held out, all sources
    holdout_file: str | None = None  #: holdout.jsonl when written
    #: rows, tokens and loss tokens dropped per quality flag (with only_flagged: written)
    flags: dict[str, FlagStats] = field(default_factory=dict)

    @property
    def mask_coverage(self) -> float:
        return self.loss_tokens / self.tokens if self.tokens else 0.0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExportStats:
        """The stats of an earlier export from its stats.json (computed keys dropped)."""
        known = {f for f in cls.__dataclass_fields__}  # type: ignore[attr-defined]
        args = {k: v for k, v in d.items() if k in known}
        args["flags"] = {k: FlagStats(**v) for k, v in (d.get("flags") or {}).items()}
        args["sources"] = {
            name: SourceExportStats(
                **{k: v for k, v in src.items() if k not in ("mask_coverage", "flags")},
                flags={k: FlagStats(**v) for k, v in (src.get("flags") or {}).items()},
            )
            for name, src in (d.get("sources") or {}).items()
        }
        return cls(**args)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mask_coverage"] = round(self.mask_coverage, 6)
        for name, s in self.sources.items():
            d["sources"][name]["mask_coverage"] = round(s.mask_coverage, 6)
        d["created_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        return d


def manifest_settings(rd: RunDir) -> dict[str, Any]:
    """The ``export:`` section of the run directory's manifest (regen.manifest.Export, its
    defaults where the section or the manifest is missing): the settings both ``regen export``
    and ``regen train`` start from, before their own overrides."""
    from regen.errors import RegenError
    from regen.manifest import Export

    try:
        data = read_manifest_data(rd) or {}
        return Export.model_validate(data.get("export") or {}).model_dump()
    except (OSError, RegenError, ValidationError) as e:
        log.warning("%s: the manifest's export section is not readable (%s); using the "
                    "defaults", rd.uri, e)  # fmt: skip
        return Export().model_dump()


def export_settings(rd: RunDir, **overrides: Any) -> dict[str, Any]:
    """:func:`manifest_settings`, then every override that is not None: the keyword
    arguments of :func:`export_run` (seed, drop_truncated, max_length, shard_rows, holdout,
    drop_flags)."""
    settings = manifest_settings(rd)
    settings.update({k: v for k, v in overrides.items() if v is not None})
    return settings


def drop_share(dropped: dict[str, int], rows_read: int) -> float:
    """Share of the rows an export could train on that it dropped (reasons of
    :data:`KEPT_ELSEWHERE` are neither)."""
    elsewhere = sum(n for reason, n in dropped.items() if reason in KEPT_ELSEWHERE)
    lost = sum(n for reason, n in dropped.items() if reason not in KEPT_ELSEWHERE)
    candidates = rows_read - elsewhere
    return lost / candidates if candidates > 0 else 0.0


def check_drop_share(stats: ExportStats | layout.ExportRecord, max_share: float) -> None:
    """ConfigError (one line: the share, the reasons, how to go on) when the export dropped
    more than ``max_share`` of the rows it could train on."""
    dropped = dict(stats.dropped)
    share = drop_share(dropped, stats.rows_read)
    if share <= max_share:
        return
    lost = {k: v for k, v in dropped.items() if k not in KEPT_ELSEWHERE}
    reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(lost.items(), key=lambda kv: -kv[1]))
    raise ConfigError(
        f"the export of {stats.run_dir} drops {sum(lost.values()):,} of the rows it could "
        f"train on ({share:.0%} > {max_share:.0%}: {reasons}); look at them with `regen export "
        "--only-flagged --format conversations`, or accept it with --allow-drops "
        "(export.max_drop_share)",
        field="export.max_drop_share",
    )


def export_run(
    rd: RunDir,
    out: str,
    *,
    seed: int = 0,
    drop_truncated: bool = True,
    max_length: int | None = None,
    shard_rows: int = 10000,
    fmt: Format = "pretokenized",
    holdout: int = 0,
    drop_flags: Iterable[str] | str = DEFAULT_DROP_FLAGS,
    only_flagged: bool = False,
    max_drop_share: float | None = None,
    check: bool = True,
    setting: str | None = None,
    keep_unproven: bool = False,
) -> ExportStats:
    """Export every row of the run directory ``rd`` to ``out`` (see the module docstring).
    ``drop_flags``: quality flags whose rows are dropped (names, a comma string, ``default``,
    ``all``, ``none``). ``max_drop_share``: refuse (:func:`check_drop_share`) before writing
    anything when the rules would drop a larger share of the rows. ``check``: run the cheap
    damage check first (False: the caller did). ``setting``: keep only the rows of this
    settings id (``run.json`` lists the run's). ``keep_unproven``: keep the local rows whose
    token_check cannot show they are the model's tokens (dropped as :data:`UNPROVEN`)."""
    flags = parse_flags(drop_flags, "drop_flags")
    if only_flagged and not flags:
        raise ConfigError("--only-flagged needs at least one flag to look for", field="drop_flags")
    if fmt not in FORMATS:
        raise ConfigError(f"export format must be one of {FORMATS}, got {fmt!r}", field="format")
    if holdout < 0:
        raise ConfigError("holdout must be >= 0 (samples per source)", field="holdout")
    if shard_rows < 0:
        raise ConfigError("shard_rows must be >= 0 (0: one shard)", field="shard_rows")
    if max_length is not None and max_length <= 0:
        raise ConfigError("max_length must be > 0", field="max_length")
    rd.require()
    if check:
        from regen.store.verify import refuse_damaged

        refuse_damaged(rd, "export")
    planned = _recorded_plan(rd)
    if setting is not None:
        _check_setting(rd, setting)
    stats = ExportStats(
        run_dir=rd.uri,
        out=str(out),
        format=fmt,
        seed=seed,
        drop_truncated=drop_truncated,
        max_length=max_length,
        shard_rows=shard_rows,
        holdout=holdout,
        drop_flags=list(flags),
        only_flagged=only_flagged,
        keep_unproven=keep_unproven,
        setting=setting,
    )
    parts, table = _read_keys(rd, fmt, stats)
    latest = _latest_attempts(table)
    why_not = _not_current(table, planned, setting)
    # --only-flagged lists what the export drops: nothing is held out of that listing
    held = {} if only_flagged else _holdout(table, holdout, seed, latest, why_not)
    order = _select(
        table,
        fmt,
        stats,
        drop_truncated=drop_truncated,
        max_length=max_length,
        held={sid for first in held.values() for sid in first},
        latest=latest,
        drop_flags=frozenset(flags),
        only_flagged=only_flagged,
        why_not=why_not,
        keep_unproven=keep_unproven,
    )
    if max_drop_share is not None and not only_flagged:
        check_drop_share(stats, max_drop_share)
    sids, turns = table.column("sample_id").to_pylist(), table.column("turn").to_pylist()
    order.sort(key=lambda i: (sids[i], turns[i]))
    random.Random(seed).shuffle(order)
    ntok = table.column("num_tokens").to_pylist()

    dest = RunDir.open(out, create=True)
    _remove_old_shards(dest, fmt)
    size = shard_rows or max(len(order), 1)
    with tempfile.TemporaryDirectory(prefix="regen-export-") as spill:
        lines = _ordered_lines(rd, parts, order, fmt, Path(spill), inspect=only_flagged)
        for n, start in enumerate(range(0, len(order), size)):
            rows = order[start : start + size]
            name = layout.shard_name(fmt, n)
            with dest.atomic_writer(name) as f:
                for _ in rows:
                    f.write((next(lines) + "\n").encode("utf-8"))
            tokens = sum(ntok[i] for i in rows)
            stats.shards.append({"file": name, "rows": len(rows), "tokens": tokens})
    _write_holdout(rd, dest, parts, held, stats)
    layout.EXPORT_STATS_FILE.write(dest, layout.ExportRecord.model_validate(stats.to_dict()))
    log.info(
        "exported %d of %d rows (%d tokens, mask coverage %.3f) to %s in %d shard(s)",
        stats.rows_written,
        stats.rows_read,
        stats.tokens,
        stats.mask_coverage,
        out,
        len(stats.shards),
    )
    made = [k for k in stats.settings if k not in ("native", "unknown")]
    if len(made) > 1:
        log.warning("the written rows mix %d settings (regen run --force): %s; keep one with "
                    "--setting ID", len(made), ", ".join(f"{k} {stats.settings[k]:,} rows"
                                                         for k in made))  # fmt: skip
    return stats


def _recorded_plan(rd: RunDir) -> pa.Table | None:
    """The latest plan (regen.store.planned.recorded_plan); None with a warning when the run
    directory has none (stale answers cannot be told apart then); a damaged one is refused."""
    from regen.store.planned import recorded_plan

    planned, why = recorded_plan(rd)
    if why:
        raise RunDirError(
            f"{rd.uri} is damaged, export refused: {why}; run `regen verify {rd.uri} --repair` "
            "(it rebuilds the plan index from the sources)"
        )
    if planned is None:
        log.warning("%s has no plan index (%s): answers of source rows edited since cannot be "
                    "told apart; `regen verify --repair` writes it", rd.uri,
                    layout.PLAN_INDEX)  # fmt: skip
    return planned


def _check_setting(rd: RunDir, setting: str) -> None:
    """``setting`` is a settings id of the run (run.json ``settings``), else ConfigError."""
    run = layout.RUN_FILE.read(rd)
    known = sorted(run.settings) if run is not None else []
    if setting not in known:
        have = ", ".join(known) or "none recorded"
        raise ConfigError(
            f"--setting {setting!r} is not a settings id of {rd.uri} (it has: {have}; "
            "`regen status` shows each one's rows)",
            field="setting",
        )


def _not_current(table: pa.Table, planned: pa.Table | None, setting: str | None) -> list[str]:
    """Per row, why it does not count ("" when it does): ``not_planned`` and ``stale`` against
    the recorded plan, ``other_setting`` against ``setting`` (module docstring)."""
    n = table.num_rows
    out = [""] * n
    if planned is not None and n:
        import pyarrow.compute as pc

        ids = table.column("sample_id")
        idx = pc.index_in(ids, value_set=planned.column("id"))
        want = planned.column("content_hash").take(pc.fill_null(idx, 0)) if len(planned) else None
        have = table.column("content_hash").to_pylist()
        pos = idx.to_pylist()
        wanted = want.to_pylist() if want is not None else []
        for i in range(n):
            if pos[i] is None:
                out[i] = "not_planned"
            elif have[i] is not None and have[i] != wanted[i]:
                out[i] = "stale"
    if setting is not None:
        made = table.column("settings").to_pylist()
        kinds = table.column("token_source").to_pylist()
        for i in range(n):
            if not out[i] and made[i] != setting and kinds[i] != "native":
                out[i] = "other_setting"
    return out


def _read_keys(rd: RunDir, fmt: str, stats: ExportStats) -> tuple[list[_Part], pa.Table]:
    """The parts (name order) and the key columns of all their rows, concatenated."""
    names = [n for n in rd.list(layout.PARTS_DIR) if layout.part_stem(n) is not None]
    needed = set(_KEY_COLUMNS + _DATA_COLUMNS[fmt]) - {*ADDED_COLUMNS.names,
                                                       *ANSWER_COLUMNS.names}  # fmt: skip
    parts: list[_Part] = []
    tables = []
    start = 0
    for name in names:
        path = rd.path(f"{layout.PARTS_DIR}/{name}")
        try:
            with rd.fs.open_input_file(path) as f:
                pf = pq.ParquetFile(f)
                missing = sorted(needed - set(pf.schema_arrow.names))
                if missing:
                    raise RunDirError(f"{rd.uri}: part {name} lacks column(s) {missing}")
                groups = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
                have = [c for c in _KEY_COLUMNS if c in pf.schema_arrow.names]
                tables.append(with_added_columns(pf.read(columns=have)))
        except (OSError, pa.ArrowInvalid) as e:
            raise RunDirError(f"{rd.uri}: cannot read part {name}: {e}") from e
        parts.append(_Part(name, path, start, groups))
        start += tables[-1].num_rows
    stats.parts = len(tables)
    if not tables:
        log.warning("%s: no Parquet parts under %s/", rd.uri, layout.PARTS_DIR)
        return parts, _empty(list(_KEY_COLUMNS))
    return parts, pa.concat_tables(tables, promote_options="permissive")


def _ordered_lines(
    rd: RunDir, parts: list[_Part], order: list[int], fmt: str, spill: Path, *, inspect: bool
) -> Iterator[str]:
    """The JSON line of every row in ``order``, in that order, with bounded memory.

    Pass 1 reads the data columns one row group at a time and appends each kept row's line,
    prefixed with its output position, to the spill bucket of that position. Pass 2 yields the
    buckets in order, each sorted by position.
    """
    position = {row: p for p, row in enumerate(order)}
    window = max(WINDOW_ROWS, -(-len(order) // MAX_BUCKETS))
    n_buckets = -(-len(order) // window)
    if fmt == "pretokenized":
        render = _pretokenized_lines
    else:
        render = partial(_conversation_lines, inspect=inspect)
    files = [(spill / f"b{b:05d}").open("w", encoding="utf-8") for b in range(n_buckets)]
    try:
        for found, rows in _read_rows(rd, parts, position, list(_DATA_COLUMNS[fmt])):
            for i, line in zip(found, render(rows), strict=True):
                pos = position[i]
                files[pos // window].write(f"{pos}\t{line}\n")
    finally:
        for fh in files:
            fh.close()
    for b in range(n_buckets):
        path = spill / f"b{b:05d}"
        with path.open(encoding="utf-8") as fh:
            entries = [line.rstrip("\n").split("\t", 1) for line in fh]
        path.unlink()
        entries.sort(key=lambda e: int(e[0]))
        for _, line in entries:
            yield line


def _read_rows(
    rd: RunDir, parts: list[_Part], wanted: set[int] | dict[int, Any], columns: list[str]
) -> Iterator[tuple[list[int], pa.Table]]:
    """The ``columns`` of the rows numbered in ``wanted``, one row group at a time: (their
    numbers, their rows in that order). A part from before the attempt and quality columns
    gets them filled in (:func:`with_added_columns`)."""
    for part in parts:
        try:
            with rd.fs.open_input_file(part.path) as f:
                pf = pq.ParquetFile(f)
                first = part.start
                for g, n in enumerate(part.group_rows):
                    found = [j for j in range(n) if first + j in wanted]
                    if found:
                        have = [c for c in columns if c in pf.schema_arrow.names]
                        group = with_added_columns(pf.read_row_group(g, columns=have))
                        rows = group.take(pa.array(found, type=pa.int64()))
                        yield [first + j for j in found], rows
                    first += n
        except (OSError, pa.ArrowInvalid) as e:
            raise RunDirError(f"{rd.uri}: cannot read part {part.name}: {e}") from e


def holdout_rank(seed: int, sample_id: str) -> str:
    """Where a sample stands in the holdout order: regen's stable hash of (seed, id)."""
    return stable_hash(["holdout", seed, sample_id])


def _latest_attempts(table: pa.Table) -> dict[str, int]:
    """The latest attempt of every sample answered more than once (others: 0)."""
    latest: dict[str, int] = {}
    sids = table.column("sample_id").to_pylist()
    for sid, a in zip(sids, table.column("attempt").to_pylist(), strict=True):
        if a and a > latest.get(sid, 0):
            latest[sid] = a
    return latest


def _holdout(
    table: pa.Table, n: int, seed: int, latest: dict[str, int], why_not: list[str] | None = None
) -> dict[str, dict[str, int]]:
    """Per source, the held-out samples and the row of each one's first regenerated turn of its
    latest answer (module docstring), in holdout order; rows that do not count (``why_not``:
    stale, not planned, another setting) are never held out."""
    if n <= 0:
        return {}
    attempts = table.column("attempt").to_pylist()
    sids = table.column("sample_id").to_pylist()
    sources = table.column("source").to_pylist()
    turns = table.column("turn").to_pylist()
    kinds = table.column("token_source").to_pylist()
    first: dict[str, dict[str, int]] = defaultdict(dict)  # source → sample → row
    for i, sid in enumerate(sids):
        if kinds[i] == "native" or (attempts[i] or 0) < latest.get(sid, 0):
            continue
        if why_not is not None and why_not[i]:
            continue
        rows = first[sources[i]]
        j = rows.get(sid)
        if j is None or turns[i] < turns[j]:
            rows[sid] = i
    held: dict[str, dict[str, int]] = {}
    for source in sorted(first):
        rows = first[source]
        k = min(n, len(rows) // 2)
        if k < n:
            log.warning(
                "holdout: source %s has %d samples: holding out %d, not %d (half stays for "
                "training)",
                source,
                len(rows),
                k,
                n,
            )
        chosen = sorted(rows, key=lambda sid: (holdout_rank(seed, sid), sid))[:k]
        if chosen:
            held[source] = {sid: rows[sid] for sid in chosen}
    return held


def _write_holdout(
    rd: RunDir,
    dest: RunDir,
    parts: list[_Part],
    held: dict[str, dict[str, int]],
    stats: ExportStats,
) -> None:
    """``holdout.jsonl`` of the held-out samples (removed when there are none)."""
    from regen.bench.prompts import BenchPrompt, prompt_line

    if not held:
        if dest.exists(layout.HOLDOUT):  # an earlier export's: those samples are in training now
            dest.delete(layout.HOLDOUT)
        return
    wanted = {row: sid for rows in held.values() for sid, row in rows.items()}
    prompts: dict[str, BenchPrompt] = {}
    columns = ["sample_id", "source", "turn", "messages", "tools"]
    for _, rows in _read_rows(rd, parts, wanted, columns):
        for r in rows.to_pylist():
            try:
                prompts[r["sample_id"]] = BenchPrompt(
                    source=r["source"],
                    sample_id=r["sample_id"],
                    turn=r["turn"],
                    messages=json.loads(r["messages"] or "[]"),
                    tools=json.loads(r["tools"]) if r["tools"] else None,
                )
            except (ValueError, ValidationError) as e:  # still out of training
                log.warning("holdout: %s has no prompt to send: %s", r["sample_id"], e)
    with dest.atomic_writer(layout.HOLDOUT) as f:
        for source, rows in held.items():
            for sid in rows:
                if sid in prompts:
                    f.write((prompt_line(prompts[sid]) + "\n").encode("utf-8"))
            stats.sources[source].holdout_samples = len(rows)
    stats.holdout_samples = len(wanted)
    stats.holdout_file = layout.HOLDOUT


def _empty(columns: list[str]) -> pa.Table:
    from regen.store.schema import SCHEMA

    return SCHEMA.empty_table().select(columns)


def with_added_columns(table: pa.Table) -> pa.Table:
    """``table`` of a part written before ADDED_COLUMNS with the key ones filled in (attempt 0,
    no flags); other tables come back as they are."""
    if "attempt" not in table.column_names:
        table = table.append_column("attempt", pa.array([0] * table.num_rows, pa.int32()))
    if "quality_flags" not in table.column_names:
        empty = pa.array([[]] * table.num_rows, pa.list_(pa.string()))
        table = table.append_column("quality_flags", empty)
    for name in ANSWER_COLUMNS.names:  # unknown: null
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, pa.string()))
    return table


def _select(
    table: pa.Table,
    fmt: str,
    stats: ExportStats,
    *,
    drop_truncated: bool,
    max_length: int | None,
    held: AbstractSet[str] = frozenset(),
    latest: dict[str, int] | None = None,
    drop_flags: frozenset[str] = frozenset(),
    only_flagged: bool = False,
    why_not: list[str] | None = None,
    keep_unproven: bool = False,
) -> list[int]:
    """Indices of the rows to write (the rows of ``held`` samples left out); fills the
    read/drop/keep numbers of ``stats``. ``latest``: each sample's latest attempt
    (:func:`_latest_attempts`); ``why_not``: per row, why it does not count
    (:func:`_not_current`; "" when it does)."""
    sids = table.column("sample_id").to_pylist()
    attempts = table.column("attempt").to_pylist()
    row_flags = table.column("quality_flags").to_pylist()
    latest = _latest_attempts(table) if latest is None else latest
    turns = table.column("turn").to_pylist()
    sources = table.column("source").to_pylist()
    truncated = table.column("truncated").to_pylist()
    ntok = table.column("num_tokens").to_pylist()
    nloss = table.column("loss_tokens").to_pylist()
    kinds = table.column("token_source").to_pylist()
    checks = table.column("token_check").to_pylist()
    dropped: Counter[str] = Counter()
    per_source: dict[str, SourceExportStats] = defaultdict(SourceExportStats)
    seen: set[tuple[str, int, int]] = set()
    keep: list[int] = []
    for i, sid in enumerate(sids):
        src = per_source[sources[i]]
        src.rows_read += 1
        if checks[i] is not None:
            stats.token_check[checks[i]] = stats.token_check.get(checks[i], 0) + 1
            if checks[i] not in TOKEN_CHECKS_OK:
                stats.token_check_problems += 1
        key = (sid, turns[i], attempts[i] or 0)
        hit = [f for f in row_flags[i] or () if f in drop_flags]
        reason = None
        if key[2] < latest.get(sid, 0):
            reason = "superseded"
        elif why_not is not None and why_not[i]:
            reason = why_not[i]
        elif key in seen:
            reason = "duplicate"
        elif only_flagged:
            seen.add(key)
            if not hit:
                reason = "not_flagged"
            else:
                _count_flags(stats, src, hit, ntok[i], nloss[i])
        else:
            seen.add(key)
            if truncated[i]:
                src.truncated_seen += 1
            if sid in held:
                reason = "holdout"
            elif hit:
                reason = "flagged"
                _count_flags(stats, src, hit, ntok[i], nloss[i])
            elif not keep_unproven and unproven(kinds[i], checks[i]):
                reason = UNPROVEN
            elif truncated[i] and drop_truncated:
                reason = "truncated"
            elif max_length is not None and ntok[i] > max_length:
                reason = "too_long"
            elif not nloss[i]:
                reason = "no_loss_tokens"
            elif fmt == "conversations" and kinds[i] == "native":
                reason = "not_convertible"
        if reason is not None:
            dropped[reason] += 1
            src.dropped[reason] = src.dropped.get(reason, 0) + 1
            continue
        keep.append(i)
    if fmt == "conversations" and not only_flagged:  # one record per sample: its highest turn
        best: dict[str, int] = {}
        for i in keep:
            if sids[i] not in best or turns[i] > turns[best[sids[i]]]:
                best[sids[i]] = i
        chosen = set(best.values())
        for i in keep:
            if i not in chosen:
                dropped["earlier_turn"] += 1
                d = per_source[sources[i]].dropped
                d["earlier_turn"] = d.get("earlier_turn", 0) + 1
        keep = [i for i in keep if i in chosen]
    made = table.column("settings").to_pylist()
    for i in keep:
        src = per_source[sources[i]]
        src.rows += 1
        src.tokens += ntok[i]
        src.loss_tokens += nloss[i]
        stats.token_source[kinds[i]] = stats.token_source.get(kinds[i], 0) + 1
        which = made[i] or ("native" if kinds[i] == "native" else "unknown")
        stats.settings[which] = stats.settings.get(which, 0) + 1
    stats.rows_read = len(sids)
    stats.rows_written = len(keep)
    stats.tokens = sum(ntok[i] for i in keep)
    stats.loss_tokens = sum(nloss[i] for i in keep)
    stats.dropped = dict(sorted(dropped.items()))
    stats.sources = dict(sorted(per_source.items()))
    return keep


def unproven(token_source: str, token_check: str | None) -> bool:
    """A locally rendered row whose token_check cannot show it is the model's tokens."""
    return token_source == "local" and token_check not in TOKEN_CHECKS_OK


def _count_flags(
    stats: ExportStats, src: SourceExportStats, flags: list[str], tokens: int, loss_tokens: int
) -> None:
    for f in flags:
        stats.flags.setdefault(f, FlagStats()).add(tokens, loss_tokens)
        src.flags.setdefault(f, FlagStats()).add(tokens, loss_tokens)


def _pretokenized_lines(chunk: pa.Table) -> list[str]:
    ids = chunk.column("input_ids").to_pylist()
    masks = chunk.column("loss_mask").to_pylist()
    return [
        json.dumps({"input_ids": a, "loss_mask": m}, separators=(",", ":"))
        for a, m in zip(ids, masks, strict=True)
    ]


def _conversation_lines(chunk: pa.Table, *, inspect: bool = False) -> list[str]:
    """Conversation records; ``inspect`` adds each row's turn, attempt and quality flags."""
    lines = []
    for r in chunk.to_pylist():
        answer: dict[str, Any] = {"role": "assistant", "content": r["content"] or ""}
        if r["reasoning"] is not None:
            answer["reasoning_content"] = r["reasoning"]
        calls = json.loads(r["tool_calls"] or "[]")
        if calls:
            answer["tool_calls"] = calls
        rec: dict[str, Any] = {
            "id": r["sample_id"],
            "conversations": [*json.loads(r["messages"] or "[]"), answer],
        }
        if r["tools"]:
            rec["tools"] = json.loads(r["tools"])
        if inspect:
            rec.update(turn=r["turn"], attempt=r["attempt"], quality_flags=r["quality_flags"])
        lines.append(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
    return lines


def _remove_old_shards(dest: RunDir, fmt: str) -> None:
    for name in dest.list(""):
        if layout.is_shard(fmt, name):
            dest.delete(name)
