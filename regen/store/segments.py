"""Journal segments: completed samples appended as they complete, and their recovery.

Files (names and records in :mod:`regen.store.layout`)::

    journal/SESSION-SEQ.jsonl   one JournalLine per completed sample, flushed when it completes
                                (local filesystems only: an object store cannot append, so
                                there a segment lives in memory until it becomes its part)

A segment is folded into the part of the same stem (:mod:`regen.store.parts`), then deleted.
A crash between the part's rename and the deletion leaves both; recovery sees the part and
only deletes the segment, so no row is ever stored twice. A line cut by a crash is a sample
that was in flight: it is dropped and requested again; so is an unreadable line.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from regen.core.errors import RunDirError
from regen.store import layout
from regen.store.completed import CompletedSample
from regen.store.layout import PartRecord
from regen.store.parts import RowsToTable, write_part
from regen.store.rundir import RunDir

log = logging.getLogger(__name__)


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
