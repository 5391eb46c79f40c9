"""The dispatch loop: keep every worker fed, record outcomes, replace dead workers. No files.

:class:`Dispatcher` runs against any :class:`~regen.engine.pool.WorkerPool` (Ray actors in a
run, objects on an event loop in unit tests):

- feed: while the queue has samples, hand the next (longest expected first) to the live worker
  with the most room below its slots + ``prefetch`` (single-sample work items, no batches);
- wait up to 0.5 s for finished items; each outcome goes to the :class:`Recorder`;
- a lost worker: every item it held goes back to the queue and a replacement starts in its
  slot while the respawn budget lasts (past it the others carry on; none left is an error
  that says a rerun resumes);
- a worker that cannot start (its constructor raised) with the same error as an earlier
  start is a configuration problem: the loop stops with that error, since no rerun can help;
- ``stop`` set: cancel what is in flight and return ``"interrupted"``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from regen.engine.pool import Worker, WorkerPool
from regen.engine.schedule import WorkQueue
from regen.engine.worker import SampleOutcome
from regen.errors import ConfigError, RegenError

log = logging.getLogger(__name__)

#: seconds one wait for finished items may block
WAIT_S = 0.5


class Recorder(Protocol):
    """Where the loop's results go (the driver's session)."""

    def completed(self, outcome: SampleOutcome, sample: Any) -> None: ...

    def failed(self, outcome: SampleOutcome) -> None: ...

    def worker_lost(self, error: str) -> None: ...

    def tick(self, snapshots: Callable[[], list[dict[str, Any]]]) -> None:
        """Once per loop: write parts/progress when due (``snapshots`` reads the workers)."""


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
    ) -> None:
        self.pool = pool
        self.prefetch = prefetch
        self.stop = stop or threading.Event()
        self.respawns_left = max_respawns if max_respawns is not None else max(3, 2 * n_workers)
        self.deaths = 0
        self.respawned = 0
        self._starts = 0
        self._init_errors: dict[str, int] = {}
        self.workers = [self._start(i) for i in range(n_workers)]

    def _start(self, index: int) -> Worker:
        w = self.pool.start(index, self._starts)
        self._starts += 1
        return w

    def live(self) -> list[Worker]:
        return [w for w in self.workers if w.alive]

    def least_loaded(self) -> Worker | None:
        """The live worker with the most room below its slots + prefetch, if any has room."""
        best, room = None, 0
        for w in self.workers:
            r = w.slots + self.prefetch - w.load
            if w.alive and r > room:
                best, room = w, r
        return best

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
            raise RegenError(
                f"all workers died ({self.deaths} deaths, respawn budget spent; last: {error}); "
                "rerun the command to resume"
            )

    def run(self, queue: WorkQueue, recorder: Recorder) -> str:
        """Dispatch every queued sample; ``"finished"`` or ``"interrupted"``."""
        outstanding: dict[Any, tuple[Worker, Any]] = {}

        def snapshots() -> list[dict[str, Any]]:
            return self.pool.snapshots(self.live())

        while True:
            while queue and not self.stop.is_set():
                w = self.least_loaded()
                if w is None:
                    break
                s = queue.pop()
                assert s is not None
                outstanding[self.pool.submit(w, s)] = (w, s)
                w.load += 1
            if self.stop.is_set():
                self.pool.cancel(list(outstanding))
                return "interrupted"
            if not outstanding:
                break
            for fin in self.pool.wait(list(outstanding), WAIT_S):
                if fin.ticket not in outstanding:  # taken back when its worker died
                    continue
                w, s = outstanding.pop(fin.ticket)
                w.load -= 1
                if fin.lost or fin.outcome is None:
                    if self.stop.is_set():
                        continue
                    mine = [t for t, (ow, _) in outstanding.items() if ow is w]
                    for t in mine:
                        queue.push(outstanding.pop(t)[1])
                    queue.push(s)
                    w.load = 0
                    recorder.worker_lost(fin.error)
                    self.lost(w, fin.error, init_failed=fin.init_failed, requeued=len(mine) + 1)
                    continue
                out = fin.outcome
                if out.slots:
                    w.slots = out.slots
                if out.status == "done":
                    recorder.completed(out, s)
                    queue.observe(
                        out.source,
                        [int(r.get("completion_tokens") or 0) for r in out.rows],
                        s.original_chars(),
                    )
                else:
                    recorder.failed(out)
            recorder.tick(snapshots)
        return "finished"
