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

A sample's answer is the rows of one attempt: 0 for its first, n for the n-th new attempt that
``regen run --retry-flagged`` requested (the ``attempt`` column). Parts are never rewritten: a
new attempt is a row set in a later part, the highest attempt is the sample's answer, and the
counters of a new attempt are the difference from the answer it replaces (its journal line and
its part record carry that; :class:`DoneSet` recomputes it from the parts on resume).

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
from regen.store.layout import SCALAR_COUNTS, FailureLine, PartRecord, SourceCounts
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
    #: a new attempt: the counters of the answer it replaces (None: the first answer)
    replaces: SourceCounts | None = None
    line: bytes | None = None  #: its journal line without ``replaces``, when packed
    table: pa.Table | None = None  #: its rows, when packed
    own: SourceCounts | None = None  #: the counters of its rows, when packed

    def to_line(self) -> bytes:
        line = self.line
        if line is None:
            obj = {"sample_id": self.sample_id, "source": self.source, "rows": self.rows}
            line = (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        if self.replaces is None:
            return line
        # the key after "rows", as a dict holding it serializes (byte-equal either way)
        extra = json.dumps(self.replaces.model_dump(), separators=(",", ":")).encode()
        return line[:-2] + b',"replaces":' + extra + b"}\n"

    def counts(self) -> SourceCounts:
        """This sample's counters (the difference from the answer it replaces, if any)."""
        own = self.own if self.own is not None else count_rows(self.rows)
        return net_counts(own, self.replaces)


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
        rep.samples.append(CompletedSample(line.sample_id, line.source, line.rows, line.replaces))
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
        for flag in r.get("quality_flags") or ():
            c.flags[flag] = c.flags.get(flag, 0) + 1
        if r.get("ended"):
            c.ended[r["ended"]] = 1
    c.truncated = int(trunc)
    c.flagged = int(bool(c.flags))
    return c


def output_tokens(rows: Iterable[dict[str, Any]]) -> list[int]:
    """Completion tokens of the regenerated rows (native rows are not answers of the server)."""
    return [int(r.get("completion_tokens") or 0) for r in rows
            if r.get("token_source") != "native"]  # fmt: skip


def net_counts(own: SourceCounts, replaces: SourceCounts | None) -> SourceCounts:
    """A stored sample's counters: its rows' (``own``, from :func:`count_rows`), less those of
    the answer it replaces (a new attempt counts done 0 and retried 1)."""
    if replaces is None:
        return own
    c = own.model_copy(deep=True)
    c.add(replaces, -1)
    c.retried += 1
    return c


def rows_attempt(rows: Iterable[dict[str, Any]]) -> int:
    """The attempt of one sample's rows (0 for rows from before the column)."""
    return max((int(r.get("attempt") or 0) for r in rows), default=0)


def part_bytes(table: pa.Table, samples: int) -> bytes:
    """The bytes of a part holding ``table`` (zstd), with its counts in the footer metadata."""
    meta = dict(table.schema.metadata or {})
    meta[META_SAMPLES] = str(samples).encode()
    meta[META_ROWS] = str(table.num_rows).encode()
    sink = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata(meta), sink, compression="zstd")
    return sink.getvalue().to_pybytes()


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
        sources=_source_totals(by_sample.values()),
        written_at=time.time(),
    )


def _source_totals(counts: Iterable[SourceCountsKey]) -> dict[str, SourceCounts]:
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
    record = make_record(stem, data, by_sample, table.num_rows)
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


@dataclass(slots=True, frozen=True)
class FlaggedAnswer:
    """The latest answer of a sample when it carries quality flags (a --retry-flagged
    candidate), with its counters (compact: one per flagged sample is held)."""

    source: str
    attempt: int
    counts: tuple[int, ...]  #: SCALAR_COUNTS values
    flags: tuple[tuple[str, int], ...]  #: rows per flag

    @classmethod
    def of(cls, source: str, attempt: int, c: SourceCounts) -> FlaggedAnswer:
        return cls(source, attempt, tuple(getattr(c, n) for n in SCALAR_COUNTS),
                   tuple(sorted(c.flags.items())))  # fmt: skip

    def to_counts(self) -> SourceCounts:
        return SourceCounts(**dict(zip(SCALAR_COUNTS, self.counts, strict=True)),
                            flags=dict(self.flags))  # fmt: skip

    @property
    def flag_names(self) -> frozenset[str]:
        return frozenset(f for f, n in self.flags if n > 0)


@dataclass(slots=True)
class DoneSet:
    """Sample ids stored in intact parts, with per-source totals of their latest answers."""

    ids: set[str] = field(default_factory=set)
    sources: dict[str, SourceCounts] = field(default_factory=dict)
    parts: int = 0
    #: parts found damaged or missing (and quarantined when reading for a run)
    damaged: list[str] = field(default_factory=list)
    #: the latest attempt of every sample answered more than once (others: 0)
    attempts: dict[str, int] = field(default_factory=dict)
    #: samples whose latest answer carries a quality flag
    flagged: dict[str, FlaggedAnswer] = field(default_factory=dict)
    #: answers found that an intact part already replaced, or stored twice (not counted)
    stale: int = 0
    #: every part's rows were read: ``attempts`` and ``flagged`` are known (read_done(answers))
    answers: bool = True

    def __contains__(self, sample_id: object) -> bool:
        return sample_id in self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, source: str, sample_id: str, rows: Iterable[dict[str, Any]]) -> None:
        """Count one stored answer of a sample (its rows)."""
        rows = list(rows)
        self.add_answer(source, sample_id, rows_attempt(rows), count_rows(rows))

    def add_answer(
        self, source: str, sample_id: str, attempt: int, counts: SourceCounts
    ) -> SourceCounts | None:
        """Count one stored answer (``counts``: its rows' own, done 1): the first answer of a
        sample, or a later attempt that replaces the latest one so far. Returns what it added
        to the totals (a later attempt: the difference), or None when it changes nothing (an
        older or repeated attempt)."""
        added = counts
        if sample_id in self.ids:
            if attempt <= self.attempts.get(sample_id, 0):
                self.stale += 1
                return None
            old = self.flagged.pop(sample_id, None)
            added = counts.model_copy(deep=True)
            added.retried += 1
            if old is not None:
                added.add(old.to_counts(), -1)
            else:  # not a flagged answer: a --retry-flagged run never replaces one
                log.warning("%s: attempt %d replaces an unflagged answer", sample_id, attempt)
                added.done -= 1
        self.ids.add(sample_id)
        if attempt:
            self.attempts[sample_id] = attempt
        if counts.flagged:
            self.flagged[sample_id] = FlaggedAnswer.of(source, attempt, counts)
        self.sources.setdefault(source, SourceCounts()).add(added)
        return added

    def answer_counts(self, sample_id: str) -> SourceCounts | None:
        """The counters of a flagged sample's latest answer (what a new attempt replaces)."""
        a = self.flagged.get(sample_id)
        return None if a is None else a.to_counts()


_COUNT_COLUMNS = (
    "sample_id",
    "source",
    "prompt_tokens",
    "completion_tokens",
    "finish_reason",
    "attempt",
    "quality_flags",
)


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
    record_problem: str = ""  #: the record itself does not parse
    schema: pa.Schema | None = None  #: the part's Arrow schema, when it was read
    #: (sample_id, turn, attempt) when read
    keys: list[tuple[str, int, int]] = field(default_factory=list)
    sha256: str = ""  #: of the part's bytes, when read
    rows: int = 0  #: rows, when read

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


def part_ids(rd: RunDir, st: PartState) -> tuple[str, list[str]]:
    """The full check of a part that has a record, reading only its ``sample_id`` column:
    (problem, its distinct sample ids). Its counters are its record's (its bytes are the ones
    the record was made from: same size and sha256)."""
    problem, data, _ = _part_bytes(rd, st)
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
    Parquet read of ``columns`` (filling ``st.samples`` with each sample's rows in this part,
    its highest attempt here). Returns the problem ("" if intact); a part without a record gets
    one when it is folded into a done-set (:func:`fold_part`)."""
    problem, data, digest = _part_bytes(rd, st)
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


def read_done(rd: RunDir, *, repair: bool = False, answers: bool = False) -> DoneSet:
    """The done-set: every ``sample_id`` of the intact parts, with per-source counters of
    their latest answers (parts in name order, which is the order they were written).

    Every part is checked: a part with a record by its bytes (size, sha256) and its ids
    (:func:`part_ids`; its counters are the record's), or by reading its counter columns
    (:func:`inspect_part`) when it has no record, when a part of the run holds new attempts, or
    with ``answers`` (the flagged answers a ``--retry-flagged`` session selects from are
    then known: :attr:`DoneSet.flagged`). A damaged or missing part counts nothing and
    is named in one warning; with ``repair`` (a run resuming) it is moved to quarantine/ with
    its record, and an intact part without a record gets one.
    """
    done = DoneSet()
    states = list_parts(rd)
    # ids alone (the record's counters) tell a part of first answers; which samples are flagged
    # and which attempt replaces which need every part's rows: read them when asked
    # (``answers``) or when a part may hold new attempts (or has no record to say)
    answers = answers or any(
        st.record is None or any(c.retried for c in st.record.sources.values())
        for st in states
        if not st.record_problem
    )

    def check(st: PartState) -> tuple[str, list[str] | None]:
        if st.record_problem:
            return st.record_problem, None
        if answers:
            return inspect_part(rd, st), None
        return part_ids(rd, st)

    # reading and hashing release the GIL: parts are checked side by side, counted in order
    done.answers = answers
    with ThreadPoolExecutor(PART_READERS, thread_name_prefix="regen-parts") as ex:
        for st, (problem, ids) in zip(states, ex.map(check, states), strict=True):
            st.problem = problem
            if not problem and ids is not None:
                if done.ids.isdisjoint(ids):  # first answers: counters from the record
                    assert st.record is not None
                    done.ids.update(ids)
                    for source, c in st.record.sources.items():
                        done.sources.setdefault(source, SourceCounts()).add(c)
                    done.parts += 1
                    continue
                st.problem = inspect_part(rd, st)  # a sample stored twice: count it once
            if st.problem:
                done.damaged.append(damage_message(st))
                log.warning("%s: %s", rd.uri, done.damaged[-1])
                if repair:
                    moved = quarantine(rd, st)
                    if moved:
                        log.info("moved to %s", ", ".join(moved))
                continue
            fold_part(done, st, rd if repair else None)
    return done


#: threads that check parts at once when the done-set is read
PART_READERS = min(8, os.cpu_count() or 1)


def fold_part(done: DoneSet, st: PartState, repair_into: RunDir | None = None) -> None:
    """Count an intact, inspected part into ``done``; a part without a record gets one made
    from what it added (written when ``repair_into`` is given)."""
    added: dict[str, SourceCountsKey] = {}
    for sid, (source, c) in st.samples.items():
        net = done.add_answer(source, sid, st.attempts.get(sid, 0), c)
        if net is not None:
            added[sid] = (source, net)
    done.parts += 1
    if st.record is None and st.size is not None:
        st.record = PartRecord(stem=st.stem, rows=st.rows, samples=len(st.samples),
                               bytes=st.size, sha256=st.sha256,
                               sources=_source_totals(added.values()))  # fmt: skip
        if repair_into is not None:
            layout.part_record_file(st.stem).write(repair_into, st.record)
            log.info("%s: wrote its missing record %s", st.part, layout.part_record_path(st.stem))


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
