"""The run directory: the only shared state of a run. The store names every path in it
(:mod:`regen.store.layout`), is its filesystem (``RunDir``) and writes every file that has a
record; the few modules that write a file themselves are listed, with why, in
docs/architecture.md "Who writes it". It imports nothing from the engine, the CLI, status or
the monitor (tests/test_architecture.py holds both).

- :mod:`regen.store.layout`: every file's name and record (the one place that names them; the
  layout is listed in its docstring), and ``JsonFile``, the reader and writer of a record.
- :mod:`regen.store.rundir`: ``RunDir``, the directory as a filesystem (local path or pyarrow
  URI) with the one atomic-write helper; the handle entry points open once and pass on.
- :mod:`regen.store.counts`: ``SourceCounts``, the one per-source counter type, and its
  arithmetic.
- :mod:`regen.store.progress`: ``progress.json``'s record (``SourceProgress`` per source).
- :mod:`regen.store.run`: run.json, manifest.yaml and the fingerprint check.
- :mod:`regen.store.lock`: the lock (compare-and-swap on local disks and S3) and its one
  staleness rule.
- :mod:`regen.store.completed`: a completed sample, as journaled and stored.
- :mod:`regen.store.segments`: the journal's segments and their recovery into parts.
- :mod:`regen.store.parts`: the Parquet parts and their records: write, list, check,
  quarantine.
- :mod:`regen.store.doneset`: the done-set, read from the intact parts.
- :mod:`regen.store.failures`: failures/, why samples could not be completed.
- :mod:`regen.store.planned`: plan/, which samples the run plans and where their rows are.
- :mod:`regen.store.verify`: ``regen verify``'s checks and repair, and the cheap check.
"""

from regen.store.rundir import RunDir

__all__ = ["RunDir"]
