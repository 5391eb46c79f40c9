"""The run directory: the only shared state of a run.

- :mod:`regen.store.layout`: every file of the run directory, its record type, reader and
  writer (the one place that names them; the layout is listed in its docstring).
- :mod:`regen.store.rundir`: ``RunDir``, the directory as a filesystem (local path or pyarrow
  URI) with the one atomic-write helper.
- :mod:`regen.store.run`: run.json, manifest.yaml and the fingerprint check.
- :mod:`regen.store.lock`: the lock (compare-and-swap on local disks and S3).
- :mod:`regen.store.journal`: journal, verified parts, done-set, failures, quarantine.
- :mod:`regen.store.verify`: ``regen verify``'s checks and repair.
"""

from regen.store.rundir import RunDir

__all__ = ["RunDir"]
