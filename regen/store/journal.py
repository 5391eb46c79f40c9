"""Completed samples: the journal, the Parquet parts and their records, the done-set, failures.

Files (names and records in :mod:`regen.store.layout`)::

    journal/SESSION-SEQ.jsonl   one JournalLine per completed sample, flushed when it completes
                                (local filesystems only: an object store cannot append, so
                                there a segment lives in memory until it becomes its part)
    parts/SESSION-SEQ.parquet   the rows of one segment (regen.rows.SCHEMA), written under a
                                temporary name and renamed; key-value metadata regen.samples,
                                regen.rows
    parts/SESSION-SEQ.json      its PartRecord (rows, samples, bytes, sha256, per-source
                                counters), written right after the part
    failures/SESSION.jsonl      FailureRecord lines; the latest record of a sample wins
    quarantine/                 parts found damaged on resume, moved aside with their records

A segment is folded into the part of the same stem, then deleted. A crash between the rename
and the deletion leaves both; recovery sees the part and only deletes the segment, so no row is
ever stored twice. A line cut by a crash is a sample that was in flight: it is dropped and
requested again. A sample is done when its ``sample_id`` appears in an intact part: on resume
every part is checked against its record (size, sha256 of its bytes, row count); a damaged,
unreadable or missing part is reported in one warning and quarantined, and its samples are
requested again (:func:`read_done`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import ValidationError

from regen.errors import RunDirError
from regen.store import layout
from regen.store.layout import FailureLine, PartRecord, SourceCounts
from regen.store.rundir import RunDir

log = logging.getLogger(__name__)

RowsToTable = Callable[[list[dict[str, Any]]], pa.Table]

#: Parquet key-value metadata of every part
META_SAMPLES = b"regen.samples"
META_ROWS = b"regen.rows"


def _default_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    from regen.rows import rows_to_table

    return rows_to_table(rows)


@dataclass(slots=True)
class CompletedSample:
    """One sample whose every turn is done: what a journal line holds.

    A worker may have done the encoding already (regen.engine.batch): then ``line`` is its
    journal line, ``table`` its rows (regen.rows.SCHEMA), ``counts`` their counters, and
    ``rows`` may be empty."""

    sample_id: str
    source: str
    rows: list[dict[str, Any]]
    line: bytes | None = None
    table: pa.Table | None = None
    counts: SourceCounts | None = None

    def to_line(self) -> bytes:
        if self.line is not None:
            return self.line
        obj = {"sample_id": self.sample_id, "source": self.source, "rows": self.rows}
        return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()

    def row_counts(self) -> SourceCounts:
        return self.counts if self.counts is not None else count_rows(self.rows)


@dataclass(slots=True)
class SegmentReport:
    """What parsing a journal segment found."""

    samples: list[CompletedSample] = field(default_factory=list)
    cut_tail: int = 0  #: bytes of a last line cut by a crash (0: none)
    bad_lines: list[int] = field(default_factory=list)  #: 1-based numbers of unreadable lines


def scan_journal(data: bytes) -> SegmentReport:
    """The complete lines of a segment, and what could not be read."""
    rep = SegmentReport()
    lines = data.split(b"\n")
    # everything after the last newline is a line cut by a crash (in flight)
    complete, tail = lines[:-1], lines[-1]
    if tail.strip():
        rep.cut_tail = len(tail)
    for i, raw in enumerate(complete):
        if not raw.strip():
            continue
        try:
            line = layout.JournalLine.model_validate_json(raw)
        except ValidationError:
            rep.bad_lines.append(i + 1)
            continue
        rep.samples.append(CompletedSample(line.sample_id, line.source, line.rows))
    return rep


def parse_journal(data: bytes, where: str = "journal segment") -> list[CompletedSample]:
    """The complete lines of a journal segment; a cut (or unparsable) line is dropped."""
    rep = scan_journal(data)
    if rep.cut_tail:
        log.info(
            "%s: dropping a cut last line (%d bytes): its sample is requested again",
            where,
            rep.cut_tail,
        )
    for n in rep.bad_lines:
        log.warning("%s: line %d is unreadable; its sample is requested again", where, n)
    return rep.samples


def count_rows(rows: Iterable[dict[str, Any]]) -> SourceCounts:
    """The counters of one sample's rows (done = 1)."""
    c = SourceCounts(done=1)
    trunc = False
    for r in rows:
        c.rows += 1
        c.prompt_tokens += int(r.get("prompt_tokens") or 0)
        c.completion_tokens += int(r.get("completion_tokens") or 0)
        trunc = trunc or r.get("finish_reason") == "length"
    c.truncated = int(trunc)
    return c


def part_bytes(table: pa.Table, samples: int) -> bytes:
    """The bytes of a part holding ``table`` (zstd), with its counts in the footer metadata."""
    meta = dict(table.schema.metadata or {})
    meta[META_SAMPLES] = str(samples).encode()
    meta[META_ROWS] = str(table.num_rows).encode()
    sink = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata(meta), sink, compression="zstd")
    return sink.getvalue().to_pybytes()


SourceCountsKey = tuple[str, SourceCounts]


def make_record(stem: str, data: bytes, by_sample: dict[str, SourceCountsKey]) -> PartRecord:
    """The record of a part: its size and checksum, and the counters of its samples."""
    sources: dict[str, SourceCounts] = {}
    rows = 0
    for source, counts in by_sample.values():
        sources.setdefault(source, SourceCounts()).add(counts)
        rows += counts.rows
    return PartRecord(
        stem=stem,
        rows=rows,
        samples=len(by_sample),
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        sources=sources,
        written_at=time.time(),
    )


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
    table = samples_table(samples, to_table or _default_to_table)
    if table is None:
        return None
    by_sample: dict[str, SourceCountsKey] = {}
    for s in samples:
        if s.sample_id not in by_sample:
            by_sample[s.sample_id] = (s.source, s.row_counts())
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
    record = make_record(stem, data, by_sample)
    layout.part_record_file(stem).write(rd, record)
    return record


def recover(rd: RunDir, to_table: RowsToTable | None = None, *, skip: str = "") -> int:
    """Fold every leftover journal segment (not ``skip``'s) into its part; returns samples kept."""
    parts = set(rd.list(layout.PARTS_DIR))
    kept = 0
    for name in rd.list(layout.JOURNAL_DIR):
        stem = layout.segment_stem(name)
        if stem is None or (skip and name.startswith(skip)):
            continue
        rel = layout.segment_path(stem)
        if f"{stem}{layout.PART_SUFFIX}" not in parts:
            samples = parse_journal(rd.read_bytes(rel) or b"", where=rel)
            write_part(rd, stem, samples, to_table)
            kept += len(samples)
            if samples:
                log.info("recovered %d completed samples from %s", len(samples), rel)
        rd.delete(rel)
    for name in rd.list(layout.PARTS_DIR, include_temp=True):  # leftovers of a crash mid-write
        if name.startswith(layout.TMP_PREFIX):
            rd.delete(f"{layout.PARTS_DIR}/{name}")
    return kept


@dataclass(slots=True)
class DoneSet:
    """Sample ids stored in intact parts, with per-source totals."""

    ids: set[str] = field(default_factory=set)
    sources: dict[str, SourceCounts] = field(default_factory=dict)
    parts: int = 0
    #: parts found damaged or missing (and quarantined when reading for a run)
    damaged: list[str] = field(default_factory=list)

    def __contains__(self, sample_id: object) -> bool:
        return sample_id in self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, source: str, sample_id: str, rows: Iterable[dict[str, Any]]) -> None:
        """Count a sample (and its rows) once."""
        if sample_id in self.ids:
            return
        self.ids.add(sample_id)
        self.sources.setdefault(source, SourceCounts()).add(count_rows(rows))


_COUNT_COLUMNS = ("sample_id", "source", "prompt_tokens", "completion_tokens", "finish_reason")


@dataclass(slots=True)
class PartState:
    """One part as found: its record, whether its file is there, and what is wrong."""

    stem: str
    record: PartRecord | None
    size: int | None  #: listed size; None when the part file is missing
    problem: str = ""  #: "" when intact
    #: sample id -> (source, counters), when the part was read
    samples: dict[str, SourceCountsKey] = field(default_factory=dict)
    record_problem: str = ""  #: the record itself does not parse
    schema: pa.Schema | None = None  #: the part's Arrow schema, when it was read
    keys: list[tuple[str, int]] = field(default_factory=list)  #: (sample_id, turn) when read

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


def _part_bytes(rd: RunDir, st: PartState) -> tuple[str, bytes]:
    """A part's bytes, checked against its record's size and sha256: (problem, bytes)."""
    if st.size is None:
        return "missing", b""
    data = rd.read_bytes(st.part)
    if data is None:
        return "missing", b""
    rec = st.record
    if rec is not None:
        if len(data) != rec.bytes:
            return f"size {len(data)} bytes, its record says {rec.bytes}", b""
        if hashlib.sha256(data).hexdigest() != rec.sha256:
            return "checksum mismatch (its bytes changed after it was written)", b""
    return "", data


def part_ids(rd: RunDir, st: PartState) -> tuple[str, list[str]]:
    """The full check of a part that has a record, reading only its ``sample_id`` column:
    (problem, its distinct sample ids). Its counters are its record's (its bytes are the ones
    the record was made from: same size and sha256)."""
    problem, data = _part_bytes(rd, st)
    if problem:
        return problem, []
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        if "sample_id" not in pf.schema_arrow.names:
            return "no sample_id column", []
        ids = pf.read(columns=["sample_id"]).column("sample_id")
    except (OSError, pa.ArrowException) as e:
        return f"unreadable ({_one_line(e)})", []
    assert st.record is not None
    if len(ids) != st.record.rows:
        return f"{len(ids)} rows, its record says {st.record.rows}", []
    unique: list[str] = pc.unique(ids).to_pylist()
    if len(unique) != st.record.samples:
        return f"{len(unique)} samples, its record says {st.record.samples}", []
    return "", unique


def inspect_part(rd: RunDir, st: PartState, *, columns: tuple[str, ...] = _COUNT_COLUMNS) -> str:
    """The full check of a part: its bytes against the record's size and sha256, then the
    Parquet read of ``columns`` (filling ``st.samples``). Returns the problem ("" if intact)."""
    problem, data = _part_bytes(rd, st)
    if problem:
        return problem
    rec = st.record
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        names = pf.schema_arrow.names
        table = pf.read(columns=[c for c in columns if c in names])
    except (OSError, pa.ArrowException) as e:
        return f"unreadable ({_one_line(e)})"
    if "sample_id" not in table.column_names:
        return "no sample_id column"
    if rec is not None and table.num_rows != rec.rows:
        return f"{table.num_rows} rows, its record says {rec.rows}"
    st.schema = pf.schema_arrow
    if "turn" in table.column_names:
        st.keys = list(
            zip(
                table.column("sample_id").to_pylist(), table.column("turn").to_pylist(), strict=True
            )
        )
    by_sample: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    for row in table.to_pylist():
        sid = row["sample_id"]
        src = row.get("source") or sid.split(":", 1)[0]
        by_sample.setdefault(sid, (src, []))[1].append(row)
    st.samples = {sid: (src, count_rows(rows)) for sid, (src, rows) in by_sample.items()}
    if st.record is None:
        st.record = make_record(st.stem, data, st.samples)
        st.record.written_at = 0.0  # made afterwards, from the part as found
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


def damage_message(st: PartState) -> str:
    """One line naming a damaged part and what it costs."""
    n = f"{st.record.samples} samples" if st.record is not None else "its samples"
    return f"{st.part}: {st.problem}; {n} will be requested again"


def read_done(rd: RunDir, *, repair: bool = False) -> DoneSet:
    """The done-set: every ``sample_id`` of the intact parts, with per-source counters.

    Every part is checked: a part with a record by its bytes (size, sha256) and its ids
    (:func:`part_ids`; its counters are the record's), one without by reading its counter
    columns (:func:`inspect_part`). A damaged or missing part counts nothing and
    is named in one warning; with ``repair`` (a run resuming) it is moved to quarantine/ with
    its record, and an intact part without a record gets one.
    """
    done = DoneSet()
    sums: dict[str, SourceCounts] = {}
    states = list_parts(rd)
    fast = [st.record is not None and not st.record_problem for st in states]
    with ThreadPoolExecutor(PART_READERS, thread_name_prefix="regen-parts") as ex:
        # reading and hashing release the GIL: parts are checked side by side, merged in order
        def check(st: PartState, is_fast: bool) -> tuple[str, list[str]]:
            return part_ids(rd, st) if is_fast else ("", [])

        checked = ex.map(check, states, fast)
        for st, is_fast, (problem, ids) in zip(states, fast, checked, strict=True):
            _add_part(rd, done, sums, st, is_fast, problem, ids, repair=repair)
    done.sources = sums
    return done


#: threads that check parts at once when the done-set is read
PART_READERS = min(8, os.cpu_count() or 1)


def _add_part(
    rd: RunDir,
    done: DoneSet,
    sums: dict[str, SourceCounts],
    st: PartState,
    fast: bool,
    problem: str,
    ids: list[str],
    *,
    repair: bool,
) -> None:
    """Count one part into the done-set (``fast``: checked by :func:`part_ids`, giving
    ``problem`` and ``ids``), or name, and with ``repair`` quarantine, its damage."""
    had_record = st.record is not None
    if st.record_problem:
        st.problem = st.record_problem
    elif fast:  # ids only, counters from the verified record
        st.problem = problem
        if not st.problem and not done.ids.isdisjoint(ids):
            st.problem = inspect_part(rd, st)  # a sample stored twice: count it once
        elif not st.problem:
            done.ids.update(ids)
            assert st.record is not None
            for source, c in st.record.sources.items():
                sums.setdefault(source, SourceCounts()).add(c)
            done.parts += 1
            return
    else:
        st.problem = inspect_part(rd, st)
    if st.problem:
        done.damaged.append(damage_message(st))
        log.warning("%s: %s", rd.uri, done.damaged[-1])
        if repair:
            moved = quarantine(rd, st)
            if moved:
                log.info("moved to %s", ", ".join(moved))
        return
    if repair and not had_record and st.record is not None:
        layout.part_record_file(st.stem).write(rd, st.record)
        log.info("%s: wrote its missing record %s", st.part, layout.part_record_path(st.stem))
    for sid, (source, c) in st.samples.items():
        if sid not in done.ids:
            done.ids.add(sid)
            sums.setdefault(source, SourceCounts()).add(c)
    done.parts += 1


def read_journal_lines(rd: RunDir) -> list[CompletedSample]:
    """Complete lines of every journal segment (read-only; for status views and tests)."""
    out: list[CompletedSample] = []
    for name in rd.list(layout.JOURNAL_DIR):
        stem = layout.segment_stem(name)
        if stem is not None:
            rel = layout.segment_path(stem)
            out.extend(parse_journal(rd.read_bytes(rel) or b"", where=rel))
    return out


class Journal:
    """The journal of one session: appends completed samples, folds segments into parts.

    On a filesystem that cannot append durably (an object store: ``durable=False``) the segment
    lives only in memory and becomes its part every ``part_size`` samples or
    ``part_interval_s`` seconds: a crash costs at most that much work.
    """

    def __init__(
        self,
        rd: RunDir,
        session: str,
        to_table: RowsToTable | None = None,
        *,
        durable: bool | None = None,
    ) -> None:
        self.rd = rd
        self.session = session
        self.to_table = to_table
        self.durable = not rd.is_object_store if durable is None else durable
        self.seq = 0
        self._buffer: list[CompletedSample] = []
        self._stream: Any = None
        self._opened_at = time.monotonic()
        self.parts_written = 0
        self.last_record: PartRecord | None = None

    @property
    def stem(self) -> str:
        return f"{self.session}-{self.seq:05d}"

    @property
    def pending(self) -> int:
        """Samples journaled but not yet in a part."""
        return len(self._buffer)

    def append(self, sample: CompletedSample) -> None:
        """Journal one completed sample; flushed before this returns.

        A write error (disk full, ...) raises RunDirError: the lines before are complete, the
        cut one is dropped on recovery and its sample requested again.
        """
        if not self._buffer:
            self._opened_at = time.monotonic()
        if self.durable:
            seg = layout.segment_path(self.stem)
            try:
                if self._stream is None:
                    self.rd.makedirs(layout.JOURNAL_DIR)
                    self._stream = self.rd.fs.open_output_stream(self.rd.path(seg))
                self._stream.write(sample.to_line())
                self._stream.flush()
            except OSError as e:
                raise RunDirError(
                    f"{self.rd.uri}: cannot append to {seg}: {e}; the samples journaled before "
                    "are kept, rerun the same command to resume"
                ) from e
        self._buffer.append(sample)

    def due(self, part_size: int, part_interval_s: float) -> bool:
        """Whether the buffered samples should become a part now."""
        if not self._buffer:
            return False
        return (
            len(self._buffer) >= part_size or time.monotonic() - self._opened_at >= part_interval_s
        )

    def roll(self) -> str | None:
        """Close the segment, write its part, delete it; returns the part path (or None)."""
        if self._stream is None and not self._buffer:
            return None
        seg = layout.segment_path(self.stem)
        if self._stream is not None:
            try:
                self._stream.close()
            except OSError as e:  # e.g. disk full: the part is written from memory below
                log.warning("closing %s: %s", seg, e)
            self._stream = None
        record = write_part(self.rd, self.stem, self._buffer, self.to_table)
        if self.durable:
            self.rd.delete(seg)
        self._buffer = []
        self.seq += 1
        self.last_record = record
        if record is None:
            return None
        self.parts_written += 1
        return layout.part_path(record.stem)

    def close(self) -> str | None:
        """Fold what is buffered (used at the end and on interruption)."""
        return self.roll()


#: why a sample could not be completed (one line of failures/SESSION.jsonl)
FailureRecord = FailureLine


class FailureLog:
    """Appends failure records of one session to failures/SESSION.jsonl."""

    def __init__(self, rd: RunDir, session: str) -> None:
        self.rd = rd
        self.rel = layout.failures_path(session)
        self._stream: Any = None
        self._lines: list[bytes] = []

    def append(self, rec: FailureRecord) -> None:
        line = rec.model_dump_json().encode() + b"\n"
        try:
            if self.rd.is_object_store:  # no append there: rewrite the session's file
                self._lines.append(line)
                self.rd.write_bytes_atomic(self.rel, b"".join(self._lines))
                return
            if self._stream is None:
                self.rd.makedirs(layout.FAILURES_DIR)
                self._stream = self.rd.fs.open_output_stream(self.rd.path(self.rel))
            self._stream.write(line)
            self._stream.flush()
        except OSError as e:
            raise RunDirError(f"{self.rd.uri}: cannot append to {self.rel}: {e}") from e

    def close(self) -> None:
        if self._stream is not None:
            try:
                self._stream.close()
            except OSError as e:  # a record cut by a full disk is skipped when read
                log.warning("closing %s: %s", self.rel, e)
            self._stream = None


def read_failures(rd: RunDir) -> dict[str, FailureRecord]:
    """The latest failure record of every sample (sessions in name order = time order)."""
    out: dict[str, FailureRecord] = {}
    for name in rd.list(layout.FAILURES_DIR):
        if not layout.is_failures_log(name):
            continue
        data = rd.read_bytes(f"{layout.FAILURES_DIR}/{name}") or b""
        for raw in data.split(b"\n"):
            if not raw.strip():
                continue
            try:
                rec = FailureRecord.model_validate_json(raw)
            except ValidationError:
                continue
            prev = out.get(rec.sample_id)
            if prev is None or rec.at >= prev.at:
                out[rec.sample_id] = rec
    return out


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."
