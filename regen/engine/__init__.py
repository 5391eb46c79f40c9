"""The engine: a driver and N Ray actors regenerating samples into the run directory.

- :mod:`regen.engine.driver`: ``run_job(manifest, RunDir, RunOptions)``: one session, its
  start (the run record, the plan, the endpoint check, the workers).
- :mod:`regen.engine.options`: ``RunOptions`` (how a session runs), ``JobSummary`` (how it
  ended).
- :mod:`regen.engine.inputs`: ``WorkerConfig``, the driver's one cut of the manifest for the
  workers (``worker_config``).
- :mod:`regen.engine.failfast`: configuration checks before anything starts (fail fast).
- :mod:`regen.plan.session`: the session's plan and its record.
- :mod:`regen.engine.fleet`: the session's Ray actors and the dispatch loop over them.
- :mod:`regen.engine.recorder`: what the dispatch reports, counted and stored; the end.
- :mod:`regen.engine.writes`: the session's writes, paused by a full disk.
- :mod:`regen.engine.tracker`: counters → the progress file.
- :mod:`regen.engine.pool`: ``WorkerPool`` (Ray actors, or SampleWorkers in this process).
- :mod:`regen.engine.dispatch`: the dispatch loop (feed, requeue, respawn) over a pool.
- :mod:`regen.engine.actor`: the Ray actor around a worker.
- :mod:`regen.engine.worker`: ``SampleWorker`` (clients, router, C slots, rows) in one actor;
  its lanes (:mod:`regen.engine.lanes`) and metrics pages (:mod:`regen.engine.pages`).
- :mod:`regen.engine.turns`: which requests a sample needs and the history each carries.

Files are owned by :mod:`regen.store` (names in :mod:`regen.store.layout`); the engine only
calls it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from regen.engine.driver import run_job
    from regen.engine.options import JobSummary, RunOptions

__all__ = ["JobSummary", "RunOptions", "run_job"]

#: where each name lives: imported on first use, so that a Ray actor, which imports
#: :mod:`regen.engine.actor` and what a worker needs, does not import the driver too
_LAZY = {"run_job": "regen.engine.driver", "JobSummary": "regen.engine.options",
         "RunOptions": "regen.engine.options"}  # fmt: skip


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
