"""A full disk under the run directory is a pause, not a stop.

When a write of the session (a journal line, a part, its record, progress.json, a failure
record) fails with ENOSPC or EDQUOT (:func:`regen.store.parts.disk_full`), the driver keeps
what it could not write in memory (the journal holds every sample: regen.store.segments), keeps
its requests in flight going, feeds new samples only while fewer than a bound of answers wait
(:meth:`DiskWait.holding`), and retries the writes: 0.25 s after the failure, then 0.5 s, then
every second, the small progress.json first (a cheap test of the disk: the part, encoded again
each time, is tried only once that passed). The first time all succeed ends the pause. A pause
longer than ``engine.disk_full_wait_s`` stops the session with the error of the last failed
write (exit 2, as before this wait existed); a rerun resumes. A SIGKILL during the pause loses
the answers held in memory only: they were in flight as far as the run directory knows, and
the rerun requests them again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from regen.core.errors import RunDirError
from regen.store.parts import disk_full

log = logging.getLogger(__name__)

#: seconds between the retries of a write a full disk refused: the first, the second, then each
RETRY_S = (0.25, 0.5, 1.0)
#: answers held in memory (per ``part_size``) past which no new sample is fed while the disk is
#: full: what the workers already hold still completes (bounded by their own limits)
HOLD_PARTS = 4


class DiskWait:
    """The state of one session's pause on a full disk."""

    def __init__(
        self, wait_s: float, hold_max: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.wait_s = wait_s
        self.hold_max = hold_max  #: answers held past which no new sample is fed
        self._clock = clock
        self.since: float | None = None  #: when the disk was found full (None: it is not)
        self.error: RunDirError | None = None  #: the last write it refused
        self.tries = 0  #: retries since it was found full
        self.next_at = 0.0  #: the next retry, on the clock
        self.pauses = 0  #: pauses this session
        self.paused_s = 0.0  #: seconds paused this session (ended pauses)

    @property
    def paused(self) -> bool:
        return self.since is not None

    def refused(self, error: RunDirError) -> bool:
        """A write failed with ``error``: start (True, the first time: say so) or continue the
        pause; raises ``error`` when it is not a full disk, or when the pause has lasted longer
        than ``wait_s``."""
        if not disk_full(error):
            raise error
        now = self._clock()
        first = self.since is None
        if first:
            self.since = now
            self.tries = 0
            self.pauses += 1
        self.error = error
        assert self.since is not None
        if now - self.since >= self.wait_s:
            if self.wait_s > 0:
                log.error("the disk stayed full for %.0f s (engine.disk_full_wait_s %g): "
                          "stopping", now - self.since, self.wait_s)  # fmt: skip
            raise error
        self.next_at = now + RETRY_S[min(self.tries, len(RETRY_S) - 1)]
        self.tries += 1
        return first

    def due(self) -> bool:
        """A retry is due (paused, and its time has come)."""
        return self.since is not None and self._clock() >= self.next_at

    def left_s(self) -> float:
        """Seconds to the next retry (0 when due or not paused)."""
        return max(0.0, self.next_at - self._clock()) if self.since is not None else 0.0

    def cleared(self) -> float:
        """Every write succeeded again: the pause is over; returns how long it lasted."""
        if self.since is None:
            return 0.0
        took = self._clock() - self.since
        self.since, self.error, self.tries = None, None, 0
        self.paused_s += took
        return took

    def holding(self, held: int) -> bool:
        """Whether no new sample should be fed: paused with ``held`` answers waiting, at the
        bound or past it."""
        return self.since is not None and held >= self.hold_max
