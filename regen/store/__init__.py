"""The run directory: the only shared state of a run.

Layout (a local path or a pyarrow filesystem URI)::

    RUN_DIR/
      run.json        {name, fingerprint, model, created_at, regen_version, endpoints}; written once
      manifest.yaml   the resolved manifest (no secrets: keys come from env/files)
      lock.json       {owner, host, pid, started_at, heartbeat_at}; heartbeat every ~5 s
      plan.json       per-source totals of the current session {source: {total, regenerate, native}}
      journal/        SESSION-SEQ.jsonl: one JSON line per completed sample (all its rows)
      parts/          SESSION-SEQ.parquet: immutable parts (regen.rows.SCHEMA), temp name + rename
      failures/       SESSION.jsonl: {sample_id, source, kind, status, message, attempts,
                      permanent, at}
      progress.json   counters snapshot for the dashboard (regen.progress), replaced every ~2 s

See :mod:`regen.store.rundir` (filesystem access), :mod:`regen.store.run` (create/open,
fingerprint, lock) and :mod:`regen.store.journal` (journal, parts, done-set, failures).
"""

from regen.store.rundir import RunDir

__all__ = ["RunDir"]
