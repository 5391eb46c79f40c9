"""A session's workers: the Ray actors (:class:`regen.engine.pool.RayWorkerPool`) and the
dispatch loop over them (:class:`regen.engine.dispatch.Dispatcher`). Owns no files.

The driver starts them while the plan is read (the actors boot async: :meth:`Fleet.start`),
with the :class:`regen.engine.inputs.WorkerConfig` it cut from the manifest; :meth:`Fleet.run`
feeds them the queue and reports to the session's recorder
(:class:`regen.engine.recorder.SessionRecorder`); :meth:`Fleet.close` stops the actors, and Ray
when the session started it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass

from regen.core.errors import RegenError, RunIncompleteError
from regen.engine.adaptive import DEFAULT_CONCURRENCY, describe_limit
from regen.engine.dispatch import Dispatcher
from regen.engine.inputs import WorkerConfig
from regen.engine.lanes import worker_slots
from regen.engine.pool import RayWorkerPool
from regen.engine.recorder import SessionRecorder
from regen.engine.schedule import WorkQueue

log = logging.getLogger(__name__)


def secrets(config: WorkerConfig) -> dict[str, str]:
    """API keys named by env var, for actors on other nodes (never written anywhere)."""
    out = {}
    for ep in config.endpoints:
        env = ep.key.env
        if env and os.environ.get(env):
            out[env] = os.environ[env]
    return out


@dataclass(slots=True)
class Fleet:
    """What a session starts for its requests before its plan is known, or the error that
    kept it from starting (raised only if there is work to do)."""

    config: WorkerConfig | None = None  #: what the workers run with
    started_ray: bool = False  #: the session started Ray (and shuts it down)
    pool: RayWorkerPool | None = None
    dispatcher: Dispatcher | None = None
    error: RegenError | None = None

    def start(
        self,
        session: str,
        config: WorkerConfig,
        workers: int,
        *,
        prefetch: int | None,
        max_respawns: int | None,
        stop: threading.Event,
    ) -> None:
        """``workers`` actors of ``config`` (on the running Ray) and their dispatch loop;
        ``prefetch``: samples per worker beyond its slots (None: a quarter of its
        concurrency, 2 at least)."""
        self.config = config
        level = logging.getLevelName(logging.getLogger("regen").getEffectiveLevel())
        self.pool = RayWorkerPool(session, config, workers, log_level=level,
                                  secrets=secrets(config))  # fmt: skip
        if prefetch is None:
            prefetch = max(2, (config.concurrency or DEFAULT_CONCURRENCY) // 4)
        self.dispatcher = Dispatcher(self.pool, workers, prefetch=prefetch,
                                     max_respawns=max_respawns, stop=stop)  # fmt: skip

    def run(self, queue: WorkQueue, recorder: SessionRecorder) -> str:
        """Feed the workers ``queue`` until it is done or the session stops; returns the
        state ("finished" | "interrupted"); the fleet is closed when it returns or raises."""
        try:
            if self.error is not None:
                raise self.error
            assert self.dispatcher is not None and self.pool is not None
            assert self.config is not None
            d, pool, summary = self.dispatcher, self.pool, recorder.summary
            self._say_limits(d, pool)
            cpu = time.process_time()
            try:
                state = d.run(queue, recorder)
            except RunIncompleteError as e:  # no endpoint left, all workers died: on the
                assert recorder.tracker is not None  # dashboard too; finish() keeps what is done
                recorder.tracker.driver_error(e.kind, str(e)[:300])
                raise
            finally:
                summary.workers_respawned = d.respawned
                used = summary.dispatch_cpu_s = time.process_time() - cpu
                n = summary.completed_now
                log.info("dispatch: %d samples completed in %d exchanges with the workers; "
                         "driver CPU %.2f s (%.2f ms per sample)", n, d.calls, used,
                         1000 * used / max(1, n))  # fmt: skip
            recorder.progress(lambda: pool.snapshots(d.live(), fresh=True), force=True)
            return state
        finally:
            self.close()

    def _say_limits(self, d: Dispatcher, pool: RayWorkerPool) -> None:
        """The start-up line: the workers, the endpoints, the starting in-flight limits and
        what set them."""
        assert self.config is not None
        eps = self.config.endpoints
        limits = [w.slots for w in d.workers]
        auto = worker_slots(eps, None, pool.shares(0))
        reported = any(ep.max_running_requests for ep in eps)
        log.info("%d workers against %d endpoint(s); starting in-flight limits %s, %s",
                 len(limits), len(eps), limits,
                 describe_limit(self.config.concurrency, auto, reported))  # fmt: skip

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.started_ray:
            import ray

            ray.shutdown()
            self.started_ray = False
