"""The engine: a driver and N Ray actors regenerating samples into the run directory.

- :mod:`regen.engine.turns`: which requests a sample needs and the history each carries.
- :mod:`regen.engine.worker`: ``SampleWorker`` (clients, router, C slots, rows) in one actor.
- :mod:`regen.engine.actor`: the Ray actor around it.
- :mod:`regen.engine.tracker`: counters → the progress file.
- :mod:`regen.engine.failfast`: configuration checks before anything starts (fail fast).
- :mod:`regen.plan.session`: the session's plan and its record.
- :mod:`regen.engine.pool`: ``WorkerPool`` (Ray actors, or SampleWorkers in this process).
- :mod:`regen.engine.dispatch`: the dispatch loop (feed, requeue, respawn) over a pool.
- :mod:`regen.engine.driver`: ``run_job(manifest, RunDir, RunOptions)``: one session.

Files are owned by :mod:`regen.store` (names in :mod:`regen.store.layout`); the engine only
calls it.
"""

from regen.engine.driver import JobSummary, RunOptions, run_job

__all__ = ["JobSummary", "RunOptions", "run_job"]
