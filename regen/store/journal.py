"""Completed samples: the journal, the Parquet parts, the done-set and the failure records.

Files owned here (see :mod:`regen.store` for the whole layout)::

    journal/SESSION-SEQ.jsonl   one line per completed sample, flushed when it completes:
                                {"sample_id": str, "source": str, "rows": [row, ...]}
    parts/SESSION-SEQ.parquet   the rows of one journal segment (schema regen.rows.SCHEMA),
                                written as parts/.tmp-*.parquet, then renamed
    failures/SESSION.jsonl      {sample_id, source, kind, status, message, attempts,
                                 permanent, at}; the latest record of a sample wins

A segment is folded into the part of the same stem, then deleted. A crash between the rename
and the deletion leaves both; recovery sees the part and only deletes the segment, so no row is
ever stored twice. A line cut by a crash is a sample that was in flight: it is dropped and
requested again. A sample is done when its ``sample_id`` appears in a part.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from regen.errors import RunDirError
from regen.store.rundir import TMP_PREFIX, RunDir

log = logging.getLogger(__name__)

JOURNAL_DIR = "journal"
PARTS_DIR = "parts"
FAILURES_DIR = "failures"

RowsToTable = Callable[[list[dict[str, Any]]], pa.Table]


def _default_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    from regen.rows import rows_to_table

    return rows_to_table(rows)


@dataclass(slots=True)
class CompletedSample:
    """One sample whose every turn is done: what a journal line holds."""

    sample_id: str
    source: str
    rows: list[dict[str, Any]]

    def to_line(self) -> bytes:
        obj = {"sample_id": self.sample_id, "source": self.source, "rows": self.rows}
        return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def parse_journal(data: bytes, where: str = "journal") -> list[CompletedSample]:
    """The complete lines of a journal segment; a cut (or unparsable) last line is dropped."""
    out: list[CompletedSample] = []
    lines = data.split(b"\n")
    # everything after the last newline is a line cut by a crash (in flight): drop it
    complete, tail = lines[:-1], lines[-1]
    if tail.strip():
        log.info("%s: dropping a cut last line (%d bytes): its sample is requested again",
                 where, len(tail))  # fmt: skip
    for i, raw in enumerate(complete):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
            out.append(CompletedSample(obj["sample_id"], obj["source"], obj["rows"]))
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
            log.warning("%s: line %d is unreadable; its sample is requested again", where, i + 1)
    return out


def write_part(
    rd: RunDir, stem: str, samples: list[CompletedSample], to_table: RowsToTable | None = None
) -> str | None:
    """Write the rows of ``samples`` as parts/STEM.parquet (temp name, then rename).

    Returns the part's relative path, or None when there were no rows. On any failure (disk
    full, ...) the temporary file is removed and no part is left behind.
    """
    rows = [r for s in samples for r in s.rows]
    if not rows:
        return None
    table = (to_table or _default_to_table)(rows)
    final = f"{PARTS_DIR}/{stem}.parquet"
    tmp = f"{PARTS_DIR}/{TMP_PREFIX}{stem}.parquet"
    rd.makedirs(PARTS_DIR)
    try:
        with rd.fs.open_output_stream(rd.path(tmp)) as f:
            pq.write_table(table, f, compression="zstd")
        rd.move(tmp, final)
    except BaseException as e:
        try:
            rd.delete(tmp)
        except Exception as cleanup:  # keep the original error
            log.warning("could not remove %s: %s", tmp, cleanup)
        if isinstance(e, OSError):
            raise RunDirError(
                f"{rd.uri}: cannot write part {final}: {e}; the journal is kept, "
                "rerun the same command to resume"
            ) from e
        raise
    return final


def recover(rd: RunDir, to_table: RowsToTable | None = None, *, skip: str = "") -> int:
    """Fold every leftover journal segment (not ``skip``'s) into its part; returns samples kept."""
    parts = set(rd.list(PARTS_DIR))
    kept = 0
    for name in rd.list(JOURNAL_DIR):
        if not name.endswith(".jsonl") or (skip and name.startswith(skip)):
            continue
        stem = name[: -len(".jsonl")]
        rel = f"{JOURNAL_DIR}/{name}"
        if f"{stem}.parquet" not in parts:
            samples = parse_journal(rd.read_bytes(rel) or b"", where=rel)
            write_part(rd, stem, samples, to_table)
            kept += len(samples)
            if samples:
                log.info("recovered %d completed samples from %s", len(samples), rel)
        rd.delete(rel)
    for name in rd.list(PARTS_DIR, include_temp=True):  # leftovers of a crash mid-write
        if name.startswith(TMP_PREFIX):
            rd.delete(f"{PARTS_DIR}/{name}")
    return kept


@dataclass(slots=True)
class SourceTotals:
    """Counters of one source, read from the parts."""

    done: int = 0
    rows: int = 0
    truncated: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class DoneSet:
    """Sample ids stored in parts, with per-source totals."""

    ids: set[str] = field(default_factory=set)
    sources: dict[str, SourceTotals] = field(default_factory=dict)
    parts: int = 0

    def __contains__(self, sample_id: object) -> bool:
        return sample_id in self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, source: str, sample_id: str, rows: Iterable[dict[str, Any]]) -> None:
        """Count a sample (and its rows) once."""
        if sample_id in self.ids:
            return
        self.ids.add(sample_id)
        t = self.sources.setdefault(source, SourceTotals())
        t.done += 1
        trunc = False
        for r in rows:
            t.rows += 1
            t.prompt_tokens += int(r.get("prompt_tokens") or 0)
            t.completion_tokens += int(r.get("completion_tokens") or 0)
            trunc = trunc or r.get("finish_reason") == "length"
        t.truncated += int(trunc)


_COUNT_COLUMNS = ("sample_id", "source", "prompt_tokens", "completion_tokens", "finish_reason")


def read_done(rd: RunDir) -> DoneSet:
    """The done-set: every ``sample_id`` in the parts, with per-source counters."""
    done = DoneSet()
    for name in rd.list(PARTS_DIR):
        if not name.endswith(".parquet"):
            continue
        path = rd.path(f"{PARTS_DIR}/{name}")
        schema = pq.read_schema(path, filesystem=rd.fs)
        cols = [c for c in _COUNT_COLUMNS if c in schema.names]
        table = pq.read_table(path, columns=cols, filesystem=rd.fs)
        by_sample: dict[str, tuple[str, list[dict[str, Any]]]] = {}
        for row in table.to_pylist():
            sid = row["sample_id"]
            by_sample.setdefault(sid, (row.get("source") or sid.split(":", 1)[0], []))[1].append(
                row
            )
        for sid, (source, rows) in by_sample.items():
            done.add(source, sid, rows)
        done.parts += 1
    return done


def read_journal_lines(rd: RunDir) -> list[CompletedSample]:
    """Complete lines of every journal segment (read-only; for status views and tests)."""
    out: list[CompletedSample] = []
    for name in rd.list(JOURNAL_DIR):
        if name.endswith(".jsonl"):
            rel = f"{JOURNAL_DIR}/{name}"
            out.extend(parse_journal(rd.read_bytes(rel) or b"", where=rel))
    return out


class Journal:
    """The journal of one session: appends completed samples, folds segments into parts."""

    def __init__(self, rd: RunDir, session: str, to_table: RowsToTable | None = None) -> None:
        self.rd = rd
        self.session = session
        self.to_table = to_table
        self.seq = 0
        self._buffer: list[CompletedSample] = []
        self._stream: Any = None
        self._opened_at = time.monotonic()
        self.parts_written = 0

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
        seg = f"{JOURNAL_DIR}/{self.stem}.jsonl"
        try:
            if self._stream is None:
                self.rd.makedirs(JOURNAL_DIR)
                self._stream = self.rd.fs.open_output_stream(self.rd.path(seg))
                self._opened_at = time.monotonic()
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
        if self._stream is None:
            return None
        seg = f"{JOURNAL_DIR}/{self.stem}.jsonl"
        try:
            self._stream.close()
        except OSError as e:  # e.g. disk full: the part is written from memory below
            log.warning("closing %s: %s", seg, e)
        self._stream = None
        part = write_part(self.rd, self.stem, self._buffer, self.to_table)
        self.rd.delete(seg)
        self._buffer = []
        self.seq += 1
        if part is not None:
            self.parts_written += 1
        return part

    def close(self) -> str | None:
        """Fold what is buffered (used at the end and on interruption)."""
        return self.roll()


@dataclass(slots=True)
class FailureRecord:
    """Why a sample could not be completed."""

    sample_id: str
    source: str
    kind: str  #: RegenError.kind of the last error
    status: int | None  #: HTTP status, when there was one
    message: str
    attempts: int
    permanent: bool  #: permanent ones are skipped on resume unless --retry-failed
    at: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "sample_id": self.sample_id,
            "source": self.source,
            "kind": self.kind,
            "status": self.status,
            "message": self.message,
            "attempts": self.attempts,
            "permanent": self.permanent,
            "at": self.at,
        }


class FailureLog:
    """Appends failure records of one session to failures/SESSION.jsonl."""

    def __init__(self, rd: RunDir, session: str) -> None:
        self.rd = rd
        self.rel = f"{FAILURES_DIR}/{session}.jsonl"
        self._stream: Any = None

    def append(self, rec: FailureRecord) -> None:
        line = json.dumps(rec.to_dict(), ensure_ascii=False) + "\n"
        try:
            if self._stream is None:
                self.rd.makedirs(FAILURES_DIR)
                self._stream = self.rd.fs.open_output_stream(self.rd.path(self.rel))
            self._stream.write(line.encode())
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
    for name in rd.list(FAILURES_DIR):
        if not name.endswith(".jsonl"):
            continue
        data = rd.read_bytes(f"{FAILURES_DIR}/{name}") or b""
        for raw in data.split(b"\n"):
            try:
                d = json.loads(raw)
                rec = FailureRecord(**d)
            except (json.JSONDecodeError, TypeError, UnicodeDecodeError):
                continue
            prev = out.get(rec.sample_id)
            if prev is None or rec.at >= prev.at:
                out[rec.sample_id] = rec
    return out
