"""The session's recorder: what the dispatch loop reports, counted and stored, and the end.

Owns no files: it writes through :class:`regen.engine.writes.SessionWrites`. It implements
:class:`regen.engine.dispatch.Recorder`: every completed sample is journaled at once and counted
(its source's counters; a new attempt of a flagged sample replaces the counters of the answer it
supersedes, regen.plan.attempts; one that answers a source row changed in place makes its stale
answer's counters go, regen.store.stale); a failure is recorded (permanent ones are skipped by
later sessions unless ``retry_failed``); progress.json is written every
``progress_interval_s``, with one line per endpoint a worker took out of rotation (refused or
stalled) and one when it comes back. :meth:`SessionRecorder.finish` is the session's end: what
is buffered written as a part, the final progress.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from regen.core.sample import Sample
from regen.engine.options import JobSummary, RunOptions
from regen.engine.rows import native_row
from regen.engine.tracker import ProgressTracker
from regen.engine.wire import PackedOutcome
from regen.engine.worker import SampleOutcome, WorkerSnapshot
from regen.engine.writes import SessionWrites
from regen.manifest import public_url
from regen.plan.packed import QueueItem
from regen.store.completed import CompletedSample
from regen.store.counts import SourceCounts, output_tokens
from regen.store.layout import FailureRecord

log = logging.getLogger(__name__)

#: the workers' counters, read when progress is written (regen.engine.worker.SampleWorker.snapshot)
Snapshots = Callable[[], list[WorkerSnapshot]]


class SessionRecorder:
    """Records one session's outcomes (see the module docstring)."""

    def __init__(
        self, writes: SessionWrites, summary: JobSummary, opts: RunOptions, family: str | None
    ) -> None:
        """``family``: the target's (recorded in native rows)."""
        self.writes = writes
        self.summary = summary
        self.opts = opts
        self.family = family
        self.tracker: ProgressTracker | None = None  #: set once the plan is known
        #: failures on record and this session's: sample id -> its latest failure
        self.failed_ids: dict[str, FailureRecord] = {}
        #: new attempts planned: sample id -> the counters of the answer each replaces
        self.replaces: dict[str, SourceCounts] = {}
        #: the new attempts that answer a source row changed in place (regen.store.stale):
        #: the answers they replace are stale, not counted as done
        self.superseding: set[str] = set()
        self.refused: set[str] = set()  #: endpoints announced as refused (one line each)
        self.stalled: set[str] = set()  #: endpoints announced as stalled, until back in
        self._last_progress = 0.0

    def begin(self, tracker: ProgressTracker) -> None:
        """The plan is known: counting starts on ``tracker``."""
        self.tracker = self.writes.tracker = tracker

    # -- regen.engine.dispatch.Recorder ----------------------------------------------------
    def store_native(self, sample: Sample) -> None:
        """A native sample's row, stored as it is (it never goes to a server)."""
        rows = [native_row(sample, self.family)]
        self.keep(CompletedSample(sample.id, sample.source, rows), output_tokens(rows))

    def keep(self, done: CompletedSample, tokens: list[int]) -> None:
        """Journal one completed sample (flushed), count it, write a part when one is due."""
        done.replaces = replaces = self.replaces.pop(done.sample_id, None)
        self.writes.append(done)
        prev = self.failed_ids.pop(done.sample_id, None)
        assert self.tracker is not None
        stale = done.sample_id in self.superseding
        self.superseding.discard(done.sample_id)
        self.tracker.sample_counted(done.source, done.counts(), tokens,
                                    was_failed=prev is not None and prev.permanent,
                                    retry=replaces is not None and not stale,
                                    supersedes=replaces if stale else None)  # fmt: skip
        self.summary.completed_now += 1
        self.summary.retried_now += replaces is not None
        self.writes.roll_when_due()

    def completed(self, out: PackedOutcome, sample: QueueItem) -> None:
        """A sample the workers answered, as they packed it (regen.engine.wire)."""
        done = CompletedSample(out.sample_id, out.source, [], line=out.line, table=out.table,
                               own=out.counts)  # fmt: skip
        self.keep(done, out.tokens)

    def worker_lost(self, error: str) -> None:
        self.summary.workers_died += 1
        assert self.tracker is not None
        self.tracker.driver_error("worker_died", error[:300])

    def tick(self, snapshots: Snapshots) -> None:
        self.writes.tick()
        self.progress(snapshots)

    def holding(self) -> bool:
        return self.writes.holding()

    def failed(self, out: SampleOutcome) -> None:
        rec = FailureRecord(
            sample_id=out.sample_id,
            source=out.source,
            kind=out.kind or "error",
            status=out.http_status,
            message=out.message,
            attempts=out.attempts,
            permanent=out.status == "permanent",
            at=time.time(),
        )
        self.writes.failure(rec)
        assert self.tracker is not None
        if out.sample_id in self.superseding:  # its stale answer is not done: a sample's failure
            self.superseding.discard(out.sample_id)
            self.replaces.pop(out.sample_id, None)
        elif self.replaces.pop(out.sample_id, None) is not None:
            # a new attempt failed: the sample keeps its stored answer (the next run with
            # --retry-flagged requests it again)
            self.tracker.sample_failed(out, newly_permanent=False, retry=True)
            self.summary.failed_transient += 1  # the same command requests it again
            log.warning("new attempt of %s failed (%s; its earlier answer is kept, the same "
                        "command requests it again): %s", out.sample_id, out.kind,
                        out.message[:300])  # fmt: skip
            return
        prev = self.failed_ids.get(out.sample_id)
        self.failed_ids[out.sample_id] = rec
        self.tracker.sample_failed(
            out, newly_permanent=rec.permanent and not (prev and prev.permanent)
        )
        if not rec.permanent:
            self.summary.failed_transient += 1
        log.warning("sample %s failed (%s%s): %s", out.sample_id, out.kind,
                    "" if rec.permanent else ", retried next run", out.message[:300])  # fmt: skip

    # -- progress ------------------------------------------------------------------------
    def progress(self, snapshots: Snapshots | None = None, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_progress < self.opts.progress_interval_s:
            return
        self._last_progress = now
        assert self.tracker is not None
        if snapshots is not None:
            snaps = snapshots()
            self.tracker.workers(snaps)
            self._announce_endpoints(snaps)
        self.writes.progress()
        if self.opts.on_progress is not None:
            self.opts.on_progress(self.tracker.snap)

    def _announce_endpoints(self, snaps: list[WorkerSnapshot]) -> None:
        """One line per endpoint a worker took out for an endpoint-wide fault, and one each
        time an endpoint's streams stalled (regen.engine.router, regen.engine.stall)."""
        stalled: dict[str, str] = {}
        for snap in snaps:
            for url, ep in snap.get("endpoints", {}).items():
                if ep.get("state") == "refused" and url not in self.refused:
                    self.refused.add(url)
                    log.warning("endpoint %s out of rotation for this session: %s",
                                public_url(url), ep.get("refusal"))  # fmt: skip
                if ep.get("state") == "stalled":
                    stalled[url] = ep.get("stall_reason") or "stalled"
        for url, why in stalled.items():
            if url not in self.stalled:
                log.warning("endpoint %s %s; out of rotation until its probe passes",
                            public_url(url), why)  # fmt: skip
        for url in self.stalled - stalled.keys():
            log.info("endpoint %s passed its probe: back in rotation", public_url(url))
        self.stalled = set(stalled)

    # -- the end -------------------------------------------------------------------------
    def finish(self, state: str) -> None:
        """Write what is buffered as a part, close the logs, final progress (a finished
        session waits out a full disk first: :meth:`SessionWrites.settle`)."""
        w = self.writes
        try:
            self.summary.parts_written = w.journal.parts_written
            if state == "finished":
                w.settle()
            w.journal.close()
            if self.tracker is not None:
                self.tracker.part_written(w.journal.last_record)
            self.summary.parts_written = w.journal.parts_written
            w.save_schedule()
        finally:
            w.failure_log.close()
            if self.tracker is not None:
                snap = self.tracker.snap
                self.summary.requests_sent = snap.requests.sent
                self.summary.sources = snap.model_copy(deep=True).sources
                self.tracker.write(state)
                if self.opts.on_progress is not None:
                    self.opts.on_progress(snap)
