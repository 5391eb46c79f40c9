"""How a session runs (:class:`RunOptions`, none of it part of the fingerprint) and how it ended
(:class:`JobSummary`). Owns no files."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from regen.store.progress import ProgressSnapshot, SourceProgress


@dataclass(slots=True)
class RunOptions:
    """How one session runs; none of this is part of the fingerprint."""

    endpoints: list[str] | None = None  #: URLs that replace the manifest's endpoints
    #: where the key of the ``endpoints`` given here is read (an env var, or a file): the
    #: manifest's endpoints name their own; with neither, a URL the manifest lists keeps its
    #: key and weight (regen.engine.driver.session_manifest)
    api_key_env: str | None = None
    api_key_file: str | None = None
    workers: int | None = None  #: Ray actors (default: manifest engine.workers)
    concurrency: int | None = None  #: requests in flight per actor (default: engine.concurrency)
    limit: int | None = None  #: keep the first N samples (after sources' own limits)
    retry_failed: bool = False  #: request recorded permanent failures again
    #: request done samples whose latest answer carries one of these quality flags again
    retry_flagged: tuple[str, ...] = ()
    #: new attempts a flagged sample may have in all (regen.plan.attempts)
    flagged_retries: int = 1
    force: bool = False  #: continue a run directory whose fingerprint differs
    address: str | None = None  #: Ray cluster to join (default: $RAY_ADDRESS, else local)
    prefetch: int | None = None  #: work items per actor beyond its concurrency
    #: replacement actors started when workers die, per session (default max(3, 2 x workers))
    max_respawns: int | None = None
    progress_interval_s: float = 2.0
    #: called with the snapshot each time progress.json is written (live views)
    on_progress: Callable[[ProgressSnapshot], None] | None = None
    #: set from outside to stop the session cleanly (like SIGINT)
    stop: threading.Event | None = None
    handle_signals: bool = True  #: install SIGINT/SIGTERM handlers (main thread only)
    #: stream the actors' own output (tracebacks included) to this terminal; otherwise it
    #: stays in Ray's worker log files and a lost worker is one line here
    verbose: bool = False
    #: run the fail-fast configuration checks before anything starts
    preflight: bool = True


@dataclass(slots=True)
class JobSummary:
    """How a session ended."""

    run_dir: str
    session: str
    state: str  #: "finished" | "interrupted" | "failed"
    completed_now: int = 0  #: samples completed in this session
    #: samples of this session that ran out of retries (and new attempts that failed)
    failed_transient: int = 0
    retried_now: int = 0  #: new attempts of flagged samples stored this session
    parts_written: int = 0
    requests_sent: int = 0
    workers_died: int = 0  #: actors lost this session (their samples were requeued)
    workers_respawned: int = 0  #: replacement actors started
    #: every source's counters and totals (all sessions) as the session ended
    sources: dict[str, SourceProgress] = field(default_factory=dict)
    #: CPU-s of the driver process (all its threads) while the dispatch loop ran
    dispatch_cpu_s: float = 0.0

    @property
    def total(self) -> int:
        """Samples planned (all sessions)."""
        return SourceProgress.sum(self.sources.values()).total

    @property
    def done(self) -> int:
        """Samples stored (all sessions)."""
        return SourceProgress.sum(self.sources.values()).done

    @property
    def failed_permanent(self) -> int:
        """Permanent failures on record (not done)."""
        return SourceProgress.sum(self.sources.values()).failed
