"""Journal segments: completed samples appended as they complete, and their recovery.

Files (names and records in :mod:`regen.store.layout`)::

    journal/SESSION-SEQ.jsonl   one JournalLine per completed sample, flushed when it completes
                                (local filesystems only: an object store cannot append, so
                                there a segment lives in memory until it becomes its part)

A segment is folded into the part of the same stem (:mod:`regen.store.parts`), then deleted.
A crash between the part's rename and the deletion leaves both; recovery sees the part and
only deletes the segment, so no row is ever stored twice. A line cut by a crash is a sample
that was in flight: it is dropped and requested again; so is an unreadable line.

A write that fails (a full disk: :func:`regen.store.parts.disk_full`) seals the segment: its
lines stay as they are (the last one perhaps cut), no line is appended after it, and the
samples completed from then on are held in memory only. Every sample stays in the journal's
buffer, so the next part that can be written holds them all and the segment is deleted; a crash
before that keeps the segment's complete lines (folded on recovery) and loses the samples held
in memory only, which the next run requests again, as it does in-flight ones.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import IO

from pydantic import ValidationError

from regen.core.errors import RunDirError
from regen.store import layout
from regen.store.completed import CompletedSample
from regen.store.layout import PartRecord
from regen.store.parts import RowsToTable, write_part, write_part_file, write_record
from regen.store.rundir import TMP_PREFIX, RunDir

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
        if name.startswith(TMP_PREFIX):
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

    A failed write (``append`` or ``roll``) raises :class:`RunDirError` and loses nothing of the
    session: the segment is sealed, every sample stays buffered (the one whose line failed
    too), and a later ``roll`` writes them all as one part (see the module's text).
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
        self._stream: IO[bytes] | None = None
        self._opened_at = time.monotonic()
        self.parts_written = 0
        self.last_record: PartRecord | None = None
        #: a write failed: the segment takes no more lines until its part is written
        self.sealed = False
        #: buffered samples whose line is not in the segment (held in memory only)
        self.unjournaled = 0
        #: records of written parts that could not be written yet (retried with each roll)
        self._owed: list[PartRecord] = []

    @property
    def stem(self) -> str:
        return f"{self.session}-{self.seq:05d}"

    @property
    def pending(self) -> int:
        """Samples journaled (or held) but not yet in a part."""
        return len(self._buffer)

    @property
    def owed(self) -> int:
        """Records of written parts not written yet."""
        return len(self._owed)

    def append(self, sample: CompletedSample) -> None:
        """Journal one completed sample; flushed before this returns.

        A write error (disk full, ...) raises RunDirError: the sample is kept in the buffer
        (it goes into the next part written), the lines before are complete, a cut one is
        dropped on recovery and its sample requested again; the segment is sealed.
        """
        if not self._buffer:
            self._opened_at = time.monotonic()
        self._buffer.append(sample)
        if not self.durable:
            return
        if self.sealed:
            self.unjournaled += 1
            return
        seg = layout.segment_path(self.stem)
        try:
            if self._stream is None:
                self.rd.makedirs(layout.JOURNAL_DIR)
                self._stream = self.rd.fs.open_output_stream(self.rd.path(seg))
            self._stream.write(sample.to_line())
            self._stream.flush()
        except OSError as e:
            self.unjournaled += 1
            self._seal()
            raise RunDirError(
                f"{self.rd.uri}: cannot append to {seg}: {e}; the samples journaled before "
                "are kept, rerun the same command to resume"
            ) from e

    def _seal(self) -> None:
        """No more lines into this segment (its end may be a cut line)."""
        self.sealed = True
        if self._stream is not None:
            stream, self._stream = self._stream, None
            try:
                stream.close()
            except OSError as e:  # e.g. disk full: the part is written from memory
                log.debug("closing %s: %s", layout.segment_path(self.stem), e)

    def due(self, part_size: int, part_interval_s: float) -> bool:
        """Whether the buffered samples should become a part now."""
        if not self._buffer:
            return False
        return (
            len(self._buffer) >= part_size or time.monotonic() - self._opened_at >= part_interval_s
        )

    def roll(self) -> str | None:
        """Close the segment, write its part, delete it; returns the part path (or None).

        Raises RunDirError when the part cannot be written (nothing of it is left; every
        sample stays buffered and the segment sealed, for the next roll)."""
        self._pay_records()
        if self._stream is None and not self._buffer:
            return None
        seg = layout.segment_path(self.stem)
        if self._stream is not None:
            try:
                self._stream.close()
            except OSError as e:  # e.g. disk full: the part is written from memory below
                log.warning("closing %s: %s", seg, e)
            self._stream = None
        try:
            record = write_part_file(self.rd, self.stem, self._buffer, self.to_table)
        except RunDirError:
            self.sealed = True  # its stream is closed: a new one would truncate it
            raise
        if record is not None:
            self._owed.append(record)
        if self.durable:
            self.rd.delete(seg)
        self._buffer = []
        self.sealed = False
        self.unjournaled = 0
        self.seq += 1
        self.last_record = record
        if record is None:
            return None
        self.parts_written += 1
        self._pay_records(warn=True)
        return layout.part_path(record.stem)

    def _pay_records(self, *, warn: bool = False) -> None:
        """Write the records owed (written parts whose record failed); what still fails stays
        owed (a part without its record verifies by itself: regen.store.parts)."""
        while self._owed:
            try:
                write_record(self.rd, self._owed[0])
            except RunDirError as e:
                if warn:
                    log.warning("%s; it is written again with the next part (the part "
                                "verifies by itself)", e)  # fmt: skip
                return
            self._owed.pop(0)

    def close(self) -> str | None:
        """Fold what is buffered (used at the end and on interruption)."""
        return self.roll()
