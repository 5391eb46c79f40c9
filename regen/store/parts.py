"""The Parquet parts and their records: writing, listing, checking, quarantine.

Files (names and records in :mod:`regen.store.layout`)::

    parts/SESSION-SEQ.parquet   the rows of one journal segment (regen.store.schema.SCHEMA), zstd,
                                written under a temporary name (parts/.tmp-*) and renamed;
                                key-value metadata regen.samples, regen.rows
    parts/_SESSION-SEQ.json     its PartRecord (rows, samples, bytes, sha256, per-source
                                counters), written right after the part
    quarantine/NAME             a damaged part and its record, moved aside
                                (``/`` of the path as ``__``)

Parts are never rewritten. A part is intact when its bytes match its record (size, sha256)
and its rows read as recorded; :func:`list_parts` pairs parts with records, :func:`part_ids`
and :func:`inspect_part` are the full checks (ids only, or the counter columns),
:func:`footer_problem` the cheap one (the listing and the footer), :func:`quarantine` moves a
damaged part aside. A sample's rows in a part are one attempt (the ``attempt`` column; a new
attempt of ``regen run --retry-flagged`` is a row set in a later part).

A part also verifies by itself, without its record: every data page carries a CRC32 (written
with ``write_page_checksum``, checked on every read), and its footer says how many rows and
samples it holds (``regen.samples`` / ``regen.rows``). A part whose record is missing or does
not parse is read whole (:func:`inspect_part`, ``whole=True``: every column, so every page's
checksum) and checked against its footer; when that passes, the part is intact and the record
is rebuilt from it (:func:`regen.store.doneset.fold_part`): a damaged record never costs a
part. Parts written before page checksums are checked by their footer and a full read only.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from regen.core.errors import RunDirError
from regen.store import layout
from regen.store.completed import CompletedSample
from regen.store.counts import SourceCounts, count_rows
from regen.store.layout import PartRecord
from regen.store.rundir import RunDir
from regen.store.schema import rows_to_table

log = logging.getLogger(__name__)

RowsToTable = Callable[[list[dict[str, Any]]], pa.Table]

#: the errors of a write that a full disk (or a full quota) gave
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_full(error: BaseException) -> bool:
    """Whether ``error`` (a RunDirError wrapping the OSError, or the OSError itself) is a full
    disk or quota: the errno of an OSError on its cause/context chain."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return True
        e = e.__cause__ or e.__context__
    return False


#: Parquet key-value metadata of every part
META_SAMPLES = b"regen.samples"
META_ROWS = b"regen.rows"


def _default_to_table(rows: list[dict[str, Any]]) -> pa.Table:

    return rows_to_table(rows)


def rows_attempt(rows: Iterable[dict[str, Any]]) -> int:
    """The attempt of one sample's rows (0 for rows from before the column)."""
    return max((int(r.get("attempt") or 0) for r in rows), default=0)


def part_bytes(table: pa.Table, samples: int) -> bytes:
    """The bytes of a part holding ``table`` (zstd), with its counts in the footer metadata."""
    meta = dict(table.schema.metadata or {})
    meta[META_SAMPLES] = str(samples).encode()
    meta[META_ROWS] = str(table.num_rows).encode()
    sink = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata(meta), sink, compression="zstd",
                   write_page_checksum=True)  # fmt: skip
    data: bytes = sink.getvalue().to_pybytes()
    return data


def open_part(data: bytes) -> pq.ParquetFile:
    """A part's bytes as a Parquet file whose reads check every page's CRC32 (pages written
    without one are read as they are)."""
    return pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)


SourceCountsKey = tuple[str, SourceCounts]


def make_record(
    stem: str, data: bytes, by_sample: dict[str, SourceCountsKey], rows: int
) -> PartRecord:
    """The record of a part: its size and checksum, its rows, and the counters of its
    samples (a new attempt's: the difference from the answer it replaces)."""
    return PartRecord(
        stem=stem,
        rows=rows,
        samples=len(by_sample),
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        sources=source_totals(by_sample.values()),
        written_at=time.time(),
    )


def source_totals(counts: Iterable[SourceCountsKey]) -> dict[str, SourceCounts]:
    sources: dict[str, SourceCounts] = {}
    for source, c in counts:
        sources.setdefault(source, SourceCounts()).add(c)
    return sources


def samples_table(samples: list[CompletedSample], to_table: RowsToTable) -> pa.Table | None:
    """The rows of ``samples`` in order as one table (None: no rows): the workers' tables as
    they are, the others' rows converted by ``to_table``."""
    pieces: list[pa.Table] = []
    pending: list[dict[str, Any]] = []
    for s in samples:
        if s.table is None:
            pending.extend(s.rows)
            continue
        if pending:
            pieces.append(to_table(pending))
            pending = []
        if s.table.num_rows:
            pieces.append(s.table)
    if pending:
        pieces.append(to_table(pending))
    if not pieces:
        return None
    return pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces).combine_chunks()


def write_part(
    rd: RunDir, stem: str, samples: list[CompletedSample], to_table: RowsToTable | None = None
) -> PartRecord | None:
    """Write the rows of ``samples`` as parts/STEM.parquet (temp name, then rename), then its
    record parts/STEM.json. Returns the record, or None when there were no rows. On any failure
    (disk full, ...) the temporary file is removed and no part is left behind."""
    record = write_part_file(rd, stem, samples, to_table)
    if record is not None:
        write_record(rd, record)
    return record


def write_part_file(
    rd: RunDir, stem: str, samples: list[CompletedSample], to_table: RowsToTable | None = None
) -> PartRecord | None:
    """:func:`write_part` without the record: the part is in place when this returns, its
    record (returned) not yet written (:func:`write_record`)."""
    table = samples_table(samples, to_table or _default_to_table)
    if table is None:
        return None
    by_sample: dict[str, SourceCountsKey] = {}
    for s in samples:
        if s.sample_id not in by_sample:
            by_sample[s.sample_id] = (s.source, s.counts())
    final = layout.part_path(stem)
    try:
        data = part_bytes(table, len(by_sample))
        rd.write_bytes_atomic(final, data)
    except (OSError, RunDirError) as e:
        why = e.__cause__ if isinstance(e, RunDirError) and e.__cause__ else e
        raise RunDirError(
            f"{rd.uri}: cannot write part {final}: {why}; the journal is kept, "
            "rerun the same command to resume"
        ) from e
    return make_record(stem, data, by_sample, table.num_rows)


def write_record(rd: RunDir, record: PartRecord) -> None:
    """Write a part's record parts/_STEM.json (RunDirError when it cannot: the part verifies
    by itself, and a part without its record gets it rebuilt when the run directory is next
    read, regen.store.doneset)."""
    layout.part_record_file(record.stem).write(rd, record)


#: the columns of a part its per-sample counters and content hashes are read from
COUNT_COLUMNS = (
    "sample_id",
    "source",
    "prompt_tokens",
    "completion_tokens",
    "finish_reason",
    "attempt",
    "quality_flags",
    "ended",
    "content_hash",
    "settings",
)
#: ... and ``turn``: what the full check of ``regen verify`` reads, the rows' keys with them
CHECK_COLUMNS = (*COUNT_COLUMNS, "turn")


@dataclass(slots=True)
class PartState:
    """One part as found: its record, whether its file is there, and what is wrong."""

    stem: str
    record: PartRecord | None
    size: int | None  #: listed size; None when the part file is missing
    problem: str = ""  #: "" when intact
    #: sample id -> (source, counters of its rows here), when the part was read
    samples: dict[str, SourceCountsKey] = field(default_factory=dict)
    #: sample id -> its attempt in this part, for attempts above 0
    attempts: dict[str, int] = field(default_factory=dict)
    #: the record exists but does not parse (``record`` is then None: the part is checked by
    #: itself, and its record rebuilt when it is intact)
    record_problem: str = ""
    schema: pa.Schema | None = None  #: the part's Arrow schema, when it was read
    #: (sample_id, turn, attempt) when read
    keys: list[tuple[str, int, int]] = field(default_factory=list)
    sha256: str = ""  #: of the part's bytes, when read
    rows: int = 0  #: rows, when read
    #: sample id -> content_hash of its rows here (its highest attempt), when read; None for
    #: rows written before the column
    hashes: dict[str, str | None] = field(default_factory=dict)

    @property
    def part(self) -> str:
        return layout.part_path(self.stem)


def list_parts(rd: RunDir) -> list[PartState]:
    """Every part and every part record, paired by stem (one listing, records read)."""
    sizes = rd.sizes(layout.PARTS_DIR)
    stems: dict[str, PartState] = {}
    for name, size in sizes.items():
        stem = layout.part_stem(name)
        if stem is not None:
            stems[stem] = PartState(stem, None, size)
    for name in sizes:
        stem = layout.record_stem(name)
        if stem is None:
            continue
        st = stems.setdefault(stem, PartState(stem, None, None))
        try:
            st.record = layout.part_record_file(stem).read(rd)
        except RunDirError as e:
            st.record_problem = str(e)
    return [stems[k] for k in sorted(stems)]


def footer_problem(rd: RunDir, st: PartState) -> str:
    """The cheap check of a part (one listing entry and its footer): "" when it passes."""
    if st.size is None:
        return "missing"
    rec = st.record
    if rec is not None and st.size != rec.bytes:
        return f"size {st.size} bytes, its record says {rec.bytes}"
    try:
        with rd.fs.open_input_file(rd.path(st.part)) as f:
            meta = pq.read_metadata(f)
    except (OSError, pa.ArrowException) as e:
        return f"unreadable footer ({_one_line(e)})"
    if rec is not None and meta.num_rows != rec.rows:
        return f"{meta.num_rows} rows in its footer, its record says {rec.rows}"
    return ""


def _part_bytes(rd: RunDir, st: PartState) -> tuple[str, bytes, str]:
    """A part's bytes, checked against its record's size and sha256: (problem, bytes,
    sha256)."""
    if st.size is None:
        return "missing", b"", ""
    data = rd.read_bytes(st.part)
    if data is None:
        return "missing", b"", ""
    rec = st.record
    digest = hashlib.sha256(data).hexdigest()
    if rec is not None:
        if len(data) != rec.bytes:
            return f"size {len(data)} bytes, its record says {rec.bytes}", b"", digest
        if digest != rec.sha256:
            return "checksum mismatch (its bytes changed after it was written)", b"", digest
    return "", data, digest


def part_ids(rd: RunDir, st: PartState) -> tuple[str, list[str], pa.Table | None]:
    """The full check of a part that has a record, reading only its ``sample_id`` and
    ``content_hash`` columns: (problem, its distinct sample ids, its (sample_id, content_hash)
    pairs). Its counters are its record's (its bytes are the ones the record was made from:
    same size and sha256)."""
    problem, data, _ = _part_bytes(rd, st)
    if problem:
        return problem, [], None
    try:
        pf = open_part(data)
        names = pf.schema_arrow.names
        if "sample_id" not in names:
            return "no sample_id column", [], None
        table = pf.read(columns=[c for c in ("sample_id", "content_hash") if c in names])
    except (OSError, pa.ArrowException) as e:
        return f"unreadable ({_one_line(e)})", [], None
    ids = table.column("sample_id")
    assert st.record is not None
    if len(ids) != st.record.rows:
        return f"{len(ids)} rows, its record says {st.record.rows}", [], None
    unique: list[str] = pc.unique(ids).to_pylist()
    if len(unique) != st.record.samples:
        return f"{len(unique)} samples, its record says {st.record.samples}", [], None
    return "", unique, answer_keys(table)


def answer_keys(table: pa.Table) -> pa.Table:
    """``(sample_id, content_hash)`` of a part's rows (content_hash null for rows written
    before the column)."""
    if "content_hash" in table.column_names:
        hashes = table.column("content_hash")
    else:
        hashes = pa.nulls(table.num_rows, pa.string())
    return pa.table({"sample_id": table.column("sample_id"), "content_hash": hashes})


def inspect_part(
    rd: RunDir,
    st: PartState,
    *,
    columns: tuple[str, ...] = COUNT_COLUMNS,
    whole: bool | None = None,
) -> str:
    """The full check of a part: its bytes against the record's size and sha256, then the
    Parquet read of ``columns`` (filling ``st.samples`` with each sample's rows in this part,
    its highest attempt here). Returns the problem ("" if intact); a part without a record gets
    one when it is folded into a done-set (:func:`fold_part`).

    ``whole`` (default: when the part has no record to compare with) reads every column, so
    that every page's checksum is verified, and checks the rows against the part's own footer
    (the module docstring): how a part proves itself intact without its record."""
    problem, data, digest = _part_bytes(rd, st)
    if problem:
        return problem
    rec = st.record
    whole = rec is None if whole is None else whole
    try:
        pf = open_part(data)
        names = pf.schema_arrow.names
        full = pf.read() if whole else None
        table = full if full is not None else pf.read(columns=[c for c in columns if c in names])
        if full is not None:
            table = table.select([c for c in columns if c in names])
    except (OSError, pa.ArrowException) as e:
        return f"unreadable ({_one_line(e)})"
    if "sample_id" not in table.column_names:
        return "no sample_id column"
    if rec is not None and table.num_rows != rec.rows:
        return f"{table.num_rows} rows, its record says {rec.rows}"
    if full is not None:
        problem = _self_check(pf, full)
        if problem:
            return problem
    st.schema = pf.schema_arrow
    st.sha256, st.rows = digest, table.num_rows
    rows = table.to_pylist()
    if "turn" in table.column_names:
        st.keys = [(r["sample_id"], r["turn"], int(r.get("attempt") or 0)) for r in rows]
    by_sample: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    for row in rows:
        sid = row["sample_id"]
        src = row.get("source") or sid.split(":", 1)[0]
        by_sample.setdefault(sid, (src, []))[1].append(row)
    for sid, (src, sample_rows) in by_sample.items():
        attempt = rows_attempt(sample_rows)
        if attempt:  # one attempt of a sample per part; keep the highest if there were more
            sample_rows = [r for r in sample_rows if int(r.get("attempt") or 0) == attempt]
            st.attempts[sid] = attempt
        st.samples[sid] = (src, count_rows(sample_rows))
        st.hashes[sid] = sample_rows[0].get("content_hash")
    return ""


def _self_check(pf: pq.ParquetFile, table: pa.Table) -> str:
    """A part read whole, against its own footer (row and sample counts) and the invariants of
    every row (ids and mask of one length, ``num_tokens`` that length): "" when it holds."""
    meta = pf.metadata.metadata or {}  # a part written before the counts has none to compare
    want_rows, want_samples = meta.get(META_ROWS), meta.get(META_SAMPLES)
    if want_rows is not None and table.num_rows != int(want_rows):
        return f"{table.num_rows} rows, its footer says {int(want_rows)}"
    samples = len(pc.unique(table.column("sample_id")))
    if want_samples is not None and samples != int(want_samples):
        return f"{samples} samples, its footer says {int(want_samples)}"
    names = set(table.column_names)
    if {"input_ids", "loss_mask", "num_tokens", "loss_tokens"} <= names:
        ids_len = pc.list_value_length(table.column("input_ids"))
        mask_len = pc.list_value_length(table.column("loss_mask"))
        if not pc.all(pc.equal(ids_len, mask_len)).as_py():
            return "a row's input_ids and loss_mask differ in length"
        if not pc.all(pc.equal(ids_len, table.column("num_tokens"))).as_py():
            return "a row's num_tokens is not the length of its input_ids"
    return ""


def quarantine(rd: RunDir, st: PartState) -> list[str]:
    """Move a damaged part and its record to quarantine/; returns the new paths."""
    moved = []
    for rel in (st.part, layout.part_record_path(st.stem)):
        if rd.exists(rel):
            dst = layout.quarantine_path(rel)
            rd.makedirs(layout.QUARANTINE_DIR)
            rd.delete(dst)
            rd.move(rel, dst)
            moved.append(dst)
    return moved


def set_aside_record(rd: RunDir, st: PartState) -> str | None:
    """Move a part's record that does not parse to quarantine/ (the part stays: it is checked
    by itself and gets a new record); returns where it went."""
    rel = layout.part_record_path(st.stem)
    if not rd.exists(rel):
        return None
    dst = layout.quarantine_path(rel)
    rd.makedirs(layout.QUARANTINE_DIR)
    rd.delete(dst)
    rd.move(rel, dst)
    return dst


def damage_message(st: PartState) -> str:
    """One line naming a damaged part and what it costs."""
    n = f"{st.record.samples} samples" if st.record is not None else "its samples"
    return f"{st.part}: {st.problem}; {n} will be requested again"


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."
