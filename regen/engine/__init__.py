"""The engine: a driver and N Ray actors regenerating samples into the run directory.

- :mod:`regen.engine.turns`: which requests a sample needs and the history each carries.
- :mod:`regen.engine.worker`: ``SampleWorker`` (clients, router, C slots, rows) in one actor.
- :mod:`regen.engine.actor`: the Ray actor around it.
- :mod:`regen.engine.tracker`: counters → ``progress.json``.
- :mod:`regen.engine.driver`: ``run_job(manifest, run_dir, RunOptions)``.

Files are owned by :mod:`regen.store` (layout there); the engine only calls it.
"""

from regen.engine.driver import JobSummary, RunOptions, run_job

__all__ = ["JobSummary", "RunOptions", "run_job"]
