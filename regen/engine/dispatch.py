"""The dispatch loop: keep every worker fed, record outcomes, replace dead workers.

Owns no files (its recorder, the driver, stores what it reports).

:class:`Dispatcher` runs against any :class:`~regen.engine.pool.WorkerPool` (Ray actors in a
run, objects on an event loop in unit tests):

- feed: every live worker without an exchange in flight gets the next samples (longest
  expected first) up to its slots + ``prefetch``, in one exchange call that also brings back
  its finished outcomes (:mod:`regen.engine.wire`);
- wait up to 0.5 s for replies; each outcome goes to the :class:`Recorder`;
- a lost worker: every sample it held goes back to the queue and a replacement starts in its
  slot while the respawn budget lasts (past it the others carry on; none left is an error
  that says a rerun resumes);
- a worker that cannot start (its constructor raised) with the same error as an earlier
  start is a configuration problem: the loop stops with that error, since no rerun can help;
- a worker with no endpoint left (every one refused: 401, 403, 404, not the protocol) answers
  its samples ``unsent`` (not recorded: not the samples' fault): the loop feeds no more,
  records what the workers still finish (answers already streaming, rows being built) for up
  to ``DRAIN_S``, then cancels the rest and raises :class:`~regen.core.errors.NoEndpointLeftError`
  (a rerun continues);
- the recorder holding answers it cannot write (a full disk: regen.engine.diskfull): no new
  samples are fed while :meth:`Recorder.holding` says so; what the workers hold still
  completes, and the loop waits (``WAIT_S`` at a time, ticking the recorder, which retries its
  writes) rather than end with samples still queued;
- ``stop`` set: cancel what is in flight and return ``"interrupted"``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from regen.core.errors import ConfigError, NoEndpointLeftError, RunIncompleteError
from regen.engine.pool import Worker, WorkerPool
from regen.engine.schedule import WorkQueue
from regen.engine.wire import PackedOutcome
from regen.engine.worker import SampleOutcome, WorkerSnapshot
from regen.plan.packed import QueueItem

log = logging.getLogger(__name__)

#: seconds one wait for replies may block
WAIT_S = 0.5
#: seconds the loop keeps recording what workers finish once an endpoint-wide fault left no
#: endpoint (answers already streaming); then what is in flight is cancelled
DRAIN_S = 30.0
#: samples a worker may hold in all, as a multiple of its slots + prefetch (the others are
#: building rows: bounded, should that be slow)
HELD_FACTOR = 4


class Recorder(Protocol):
    """Where the loop's results go (the driver's session)."""

    def completed(self, outcome: PackedOutcome, sample: QueueItem) -> None: ...

    def failed(self, outcome: SampleOutcome) -> None: ...

    def worker_lost(self, error: str) -> None: ...

    def tick(self, snapshots: Callable[[], list[WorkerSnapshot]]) -> None:
        """Once per loop: write parts/progress when due (``snapshots`` reads the workers)."""

    def holding(self) -> bool:
        """True while it holds as many finished answers as it may without writing them (a full
        disk): feed no new samples."""


class Dispatcher:
    """The workers of one session and the loop that feeds them."""

    def __init__(
        self,
        pool: WorkerPool,
        n_workers: int,
        *,
        prefetch: int,
        max_respawns: int | None = None,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self._clock = clock
        self.unsent = ""  #: why no endpoint is left (set: no more samples are fed)
        self._unsent_at = 0.0
        self.prefetch = prefetch
        self.stop = stop or threading.Event()
        self.respawns_left = max_respawns if max_respawns is not None else max(3, 2 * n_workers)
        self.deaths = 0
        self.respawned = 0
        self.calls = 0  #: exchanges sent
        self.replies = 0  #: replies received
        self._starts = 0
        self._init_errors: dict[str, int] = {}
        self.workers = [self._start(i) for i in range(n_workers)]

    def _start(self, index: int) -> Worker:
        w = self.pool.start(index, self._starts)
        self._starts += 1
        return w

    def live(self) -> list[Worker]:
        return [w for w in self.workers if w.alive]

    def lost(self, w: Worker, error: str, *, init_failed: bool, requeued: int) -> None:
        """Worker ``w`` is gone (its items are back in the queue): replace it, or stop."""
        w.alive = False
        self.deaths += 1
        self.pool.stop(w)
        if init_failed:
            seen = self._init_errors.get(error, 0) + 1
            self._init_errors[error] = seen
            if seen >= 2:
                raise ConfigError(
                    f"workers cannot start: {error} (the same error {seen} times: a "
                    "configuration problem that a rerun will not fix)"
                )
        if self.respawns_left > 0:
            self.respawns_left -= 1
            self.respawned += 1
            self.workers[w.index] = self._start(w.index)
            log.error(
                "worker %d %s; %d samples requeued, replacement started (%d respawns left): %s",
                w.index,
                "could not start" if init_failed else "died",
                requeued,
                self.respawns_left,
                error,
            )
            return
        log.error(
            "worker %d died; %d samples requeued to the others, respawn budget spent: %s",
            w.index,
            requeued,
            error,
        )
        if not self.live():
            raise RunIncompleteError(
                f"all workers died ({self.deaths} deaths, respawn budget spent; last: {error}); "
                "rerun the command to resume"
            )

    def run(self, queue: WorkQueue, recorder: Recorder) -> str:
        """Dispatch every queued sample; ``"finished"`` or ``"interrupted"``."""

        def snapshots() -> list[WorkerSnapshot]:
            return self.pool.snapshots(self.live())

        while True:
            if self.stop.is_set():
                self.pool.cancel(self.live())
                return "interrupted"
            if self.unsent and (not any(w.held for w in self.live())
                                or self._clock() - self._unsent_at > DRAIN_S):  # fmt: skip
                self.pool.cancel(self.live())
                raise NoEndpointLeftError(self.unsent)
            held_back = recorder.holding()
            self.feed(queue, new=not self.unsent and not held_back)
            if not any(self.pool.pending(w) for w in self.live()):
                if not (held_back and queue):
                    break  # nothing queued, nothing held
                self.stop.wait(WAIT_S)  # the recorder cannot write: wait, then retry
                recorder.tick(snapshots)
                continue
            for fin in self.pool.wait(WAIT_S):
                self.replies += 1
                w = fin.worker
                if fin.lost:
                    if self.stop.is_set() or not w.alive:
                        continue
                    taken = list(w.held.values())
                    w.held.clear()
                    for s in taken:
                        queue.push(s)
                    recorder.worker_lost(fin.error)
                    self.lost(w, fin.error, init_failed=fin.init_failed, requeued=len(taken))
                    continue
                if fin.slots:
                    w.slots = fin.slots
                w.active = fin.active
                for out in fin.outcomes:
                    if out.sample_id not in w.held:  # not this worker's any more
                        continue
                    s = w.held.pop(out.sample_id)
                    if isinstance(out, PackedOutcome):  # every done outcome is packed
                        recorder.completed(out, s)
                        queue.observe(out.source, out.tokens, s.original_chars())
                    elif out.status == "unsent":  # no endpoint left: not the sample's fault
                        if not self.unsent:
                            self.unsent, self._unsent_at = out.message, self._clock()
                    else:
                        recorder.failed(out)
            recorder.tick(snapshots)
        return "finished"

    def feed(self, queue: WorkQueue, *, new: bool = True) -> None:
        """Every live worker without an exchange in flight: up to its slots + prefetch more
        samples in their requests (at most ``HELD_FACTOR`` x that held in all; none when not
        ``new``), and its next exchange (even with none new while it holds some)."""
        for w in self.workers:
            if not w.alive or self.pool.pending(w):
                continue
            batch = []
            limit = w.slots + self.prefetch
            room = min(limit - w.load, HELD_FACTOR * limit - len(w.held)) if new else 0
            while room > 0 and queue:
                s = queue.pop()
                assert s is not None
                w.held[s.id] = s
                batch.append(s)
                room -= 1
            if w.active >= 0:
                w.active += len(batch)
            if batch or w.held:
                # ask back at half the prefetch while there is more to give
                low_water = self.prefetch // 2 if queue else -1
                self.pool.exchange(w, batch, low_water)
                self.calls += 1
