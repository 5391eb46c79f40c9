"""A session's writes to the run directory, paused by a full disk (regen.engine.diskfull).

Writes only through :mod:`regen.store`: the journal of completed samples and its Parquet parts
(:class:`regen.store.segments.Journal`), the failure records
(:class:`regen.store.failures.FailureLog`), progress.json (the session's
:class:`regen.engine.tracker.ProgressTracker`) and schedule.json (what the dispatch order
learned, :func:`regen.engine.schedule.schedule_record`); every name and record:
:mod:`regen.store.layout`.

A write a full disk refuses pauses the writes (said once): the answers wait in memory and
:meth:`SessionWrites.tick` retries them until the disk has room again, or stops the session
past ``engine.disk_full_wait_s``; any other write error stops it at once. A finished session
waits out a full disk before it ends (:meth:`SessionWrites.settle`).
"""

from __future__ import annotations

import logging
import threading

from regen.core.errors import RegenError, RunDirError
from regen.engine.diskfull import HOLD_PARTS, DiskWait
from regen.engine.schedule import LengthModel, schedule_record
from regen.engine.tracker import ProgressTracker
from regen.manifest import Engine
from regen.store import layout
from regen.store.completed import CompletedSample
from regen.store.failures import FailureLog
from regen.store.layout import FailureRecord
from regen.store.rundir import RunDir
from regen.store.segments import Journal

log = logging.getLogger(__name__)


class SessionWrites:
    """The writes of one session (see the module docstring)."""

    def __init__(self, rd: RunDir, session: str, engine: Engine, stop: threading.Event) -> None:
        """``engine``: the session's ``part_size``, ``part_interval_s`` and
        ``disk_full_wait_s``; ``stop``: set, a pause on a full disk ends the session."""
        self.rd = rd
        self.stop = stop
        self.part_size, self.part_interval_s = engine.part_size, engine.part_interval_s
        self.journal = Journal(rd, session)
        self.failure_log = FailureLog(rd, session)
        #: a full disk: the pause of the writes (regen.engine.diskfull)
        self.disk = DiskWait(engine.disk_full_wait_s, HOLD_PARTS * engine.part_size)
        #: failure records a full disk refused, written again when it has room
        self.failures_held: list[FailureRecord] = []
        self.tracker: ProgressTracker | None = None  #: set once the plan is known
        self.lengths: LengthModel | None = None  #: the dispatch order's estimate (learned)

    def append(self, done: CompletedSample) -> None:
        """Journal one completed sample (flushed; kept in memory even when the write fails)."""
        try:
            self.journal.append(done)
        except RunDirError as e:
            self.refused(e)

    def roll_when_due(self) -> None:
        """Write a part when one is due (while paused, :meth:`tick` retries the writes)."""
        if not self.disk.paused and self.journal.due(self.part_size, self.part_interval_s):
            self.roll_or_pause()

    def failure(self, rec: FailureRecord) -> None:
        """Write one failure record (behind those a full disk refused: with them)."""
        if self.failures_held:
            self.failures_held.append(rec)
            return
        try:
            self.failure_log.append(rec)
        except RunDirError as e:
            self.refused(e)  # raises unless the disk is full
            self.failures_held.append(rec)

    def progress(self) -> None:
        """Write progress.json (while paused, the retries of the writes do)."""
        assert self.tracker is not None
        if self.disk.paused:
            return
        try:
            self.tracker.write()
        except RunDirError as e:
            self.refused(e)

    def tick(self) -> None:
        """Once per dispatch loop: retry the writes when paused and due, else write a part
        when ``part_interval_s`` has passed (also while nothing completes)."""
        if self.disk.paused:
            if self.disk.due():
                self.retry()
        elif self.journal.due(self.part_size, self.part_interval_s):
            self.roll_or_pause()

    def holding(self) -> bool:
        """A full disk holds as many answers in memory as it may: feed no new samples."""
        return self.disk.holding(self.journal.pending)

    def roll_or_pause(self) -> None:
        try:
            self.roll()
        except RunDirError as e:
            self.refused(e)

    def refused(self, error: RunDirError) -> None:
        """A write failed: a full disk pauses the writes (said once), anything else stops;
        so does a pause past engine.disk_full_wait_s (raises ``error``)."""
        if not self.disk.refused(error):
            return
        held = self.journal.pending
        log.warning("%s: the disk is full (%s); holding the answers in memory (%d now, no new "
                    "samples fed past %d) and writing again as soon as it has room, for up to "
                    "%g s (engine.disk_full_wait_s)", self.rd.uri, error, held,
                    self.disk.hold_max, self.disk.wait_s)  # fmt: skip
        if self.tracker is not None:
            self.tracker.driver_error("disk_full", str(error)[:300])

    def retry(self) -> None:
        """While the disk is full: write what waits (progress.json first, a cheap test of the
        disk; failure records; the journal's part); the first time all succeed, the pause
        ends."""
        assert self.tracker is not None
        held = self.journal.pending
        try:
            self.tracker.write()
            while self.failures_held:
                self.failure_log.append(self.failures_held[0])
                self.failures_held.pop(0)
            if self.journal.pending or self.journal.owed:
                self.roll()
        except RunDirError as e:
            self.refused(e)
            return
        took = self.disk.cleared()
        log.warning("%s: the disk has room again after %.1f s; %d answers held in memory "
                    "written, going on", self.rd.uri, took, held)  # fmt: skip

    def settle(self) -> None:
        """At the end of a finished session: wait out a full disk (retrying its writes) until
        they all succeed; raises past engine.disk_full_wait_s, or at once when stopped."""
        while self.disk.paused:
            if self.stop.wait(self.disk.left_s()):
                assert self.disk.error is not None
                raise self.disk.error
            self.retry()

    def roll(self) -> None:
        """Write the journal's samples as a part; save what the order learned with it."""
        self.journal.roll()
        if self.tracker is not None:
            self.tracker.part_written(self.journal.last_record)
        self.save_schedule()

    def save_schedule(self) -> None:
        if self.lengths is None:
            return
        try:
            layout.SCHEDULE_FILE.write(self.rd, schedule_record(self.lengths))
        except RegenError as e:  # an estimate; losing it costs only ordering
            log.warning("could not write %s: %s", layout.SCHEDULE, e)
