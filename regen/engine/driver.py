"""The driver: one session of a job over one run directory.

Writes the run directory only through :mod:`regen.store` (every file, its name and its record:
:mod:`regen.store.layout`).

Flow: fail-fast checks (:mod:`regen.engine.failfast`: the run directory's path, source paths,
tokenizer, one render per source, the last two only when checks.json does not hold their key;
then the endpoints, :func:`check_serving`; before the run directory is written, Ray or any
actor) → lock → fingerprint → fold leftover journals → done-set from the verified parts (damaged
ones quarantined, their samples planned again) → plan (from the plan index under plan/ when it
is valid, else by reading the sources, which writes it; skip done ones and recorded permanent
failures unless ``retry_failed``; with ``retry_flagged``, done samples whose latest answer is
flagged are planned again as a new attempt, regen.plan.attempts) → stale answers against that
plan (regen.store.stale: not counted as done; a sample whose source row changed in place is
planned again as a new attempt that supersedes them) → native rows journaled directly → Ray and
N actors (started while the plan is read) → the dispatch loop (:mod:`regen.engine.dispatch`:
batches exchanged with the actors) → every completed sample journaled at once; every
``part_size`` samples or ``part_interval_s`` the segment becomes a Parquet part.
SIGINT/SIGTERM stop feeding, write the buffered samples as a part, release the lock and leave
the state "interrupted"; rerunning the same command resumes. A full disk pauses the writes, not
the session (:mod:`regen.engine.diskfull`): the answers wait in memory and the writes are
retried until space returns or ``engine.disk_full_wait_s`` has passed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from regen.client import EndpointInfo, check_endpoints
from regen.client.endpoints import engine_records
from regen.core.errors import ConfigError, RegenError, RunDirError, RunIncompleteError
from regen.core.sample import Sample
from regen.engine.adaptive import DEFAULT_CONCURRENCY, describe_limit
from regen.engine.diskfull import HOLD_PARTS, DiskWait
from regen.engine.dispatch import Dispatcher
from regen.engine.failfast import check_run_dir, preflight
from regen.engine.inputs import WorkerConfig, worker_config
from regen.engine.lanes import worker_slots
from regen.engine.pool import RayWorkerPool
from regen.engine.rows import native_row
from regen.engine.schedule import LengthModel, WorkQueue, schedule_record
from regen.engine.tracker import ProgressTracker
from regen.engine.wire import PackedOutcome
from regen.engine.worker import SampleOutcome
from regen.manifest import Endpoint, Manifest, public_url
from regen.plan.attempts import RetryFlagged, select
from regen.plan.packed import QueueItems
from regen.plan.session import SessionPlan, plan_session, write_plan
from regen.store import layout
from regen.store.completed import CompletedSample
from regen.store.counts import SourceCounts, output_tokens
from regen.store.doneset import DoneSet, read_done
from regen.store.failures import FailureLog, FailureRecord, read_failures
from regen.store.lock import RunLock
from regen.store.planned import open_index, recorded_plan
from regen.store.progress import ProgressSnapshot, SourceProgress
from regen.store.run import new_session_id, prepare_run, record_engines, with_recorded_cut
from regen.store.rundir import RunDir
from regen.store.segments import Journal, recover
from regen.store.stale import StaleSet, stale_answers
from regen.template.render import RenderSetup

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RunOptions:
    """How one session runs; none of this is part of the fingerprint."""

    endpoints: list[str] | None = None  #: URLs that replace the manifest's endpoints
    #: where the key of the ``endpoints`` given here is read (an env var, or a file): the
    #: manifest's endpoints name their own; with neither, an URL the manifest lists keeps its
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


@dataclass(slots=True)
class Serving:
    """The usable endpoints (:func:`regen.client.check_endpoints`) and what run.json's
    ``engines`` records of them."""

    infos: list[EndpointInfo]
    records: dict[str, dict[str, Any]]


def check_serving(m: Manifest, session: str) -> Serving:
    """Check the endpoints (given, reachable, serving the target model) and that their rows
    can be built; raises the :class:`RegenError` that says what is wrong."""

    infos = asyncio.run(
        check_endpoints(m.endpoints, m.target.model, base_dir=m.base_dir, seed=m.sampling.seed)
    )
    records = engine_records(infos, m.sampling, session)
    local = [url for url, r in records.items() if r["token_path"] == "local"]
    if local and m.family() is None:
        raise ConfigError(
            f"target.family: {local[0]} gives no token ids and the target's model family "
            "is unknown (docs/targets.md): its answers cannot be rendered here; serve it "
            "with SGLang or vLLM, or set target.family",
            field="target.family",
        )
    return Serving(infos, records)


def likely_work(rd: RunDir, opts: RunOptions) -> bool:
    """False when the last session finished (then no endpoint is needed before the plan says
    there is work); read without creating anything."""
    if opts.retry_failed or opts.retry_flagged:
        return True
    try:
        last = layout.PROGRESS_FILE.read(rd)
    except (RegenError, OSError):  # unreadable: the plan tells
        return True
    return last is None or last.state != "finished"


def session_manifest(manifest: Manifest, opts: RunOptions) -> Manifest:
    """``manifest`` as this session runs it: the endpoints ``opts`` gives (with its key, else
    the manifest's endpoint of the same URL, else keyless), its workers and concurrency."""
    update: dict[str, Any] = {}
    if opts.endpoints:
        keyed = opts.api_key_env is not None or opts.api_key_file is not None
        by_url = {} if keyed else {e.url: e for e in manifest.endpoints}
        update["endpoints"] = [
            by_url.get(u.rstrip("/"))
            or Endpoint(url=u, api_key_env=opts.api_key_env, api_key_file=opts.api_key_file)
            for u in opts.endpoints
        ]
    eng: dict[str, Any] = {}
    if opts.workers is not None:
        eng["workers"] = opts.workers
    if opts.concurrency is not None:
        eng["concurrency"] = opts.concurrency
    if eng:
        update["engine"] = manifest.engine.model_copy(update=eng)
    return manifest.model_copy(update=update) if update else manifest


def connect_ray(address: str | None, *, verbose: bool = False) -> bool:
    """Join ``address`` / $RAY_ADDRESS, else start a quiet local Ray; True if we started it.

    The actors' output (their tracebacks included) reaches this terminal only when
    ``verbose``; otherwise it stays in Ray's worker log files (``<ray session>/logs``).
    """
    import ray

    if ray.is_initialized():
        return False
    addr = address or os.environ.get("RAY_ADDRESS") or None
    if addr:
        ray.init(address=addr, logging_level=logging.WARNING, log_to_driver=verbose)
    else:
        ray.init(
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=verbose,
            _node_ip_address="127.0.0.1",
            num_cpus=max(2, os.cpu_count() or 2),
        )
    return True


def _secrets(config: WorkerConfig) -> dict[str, str]:
    """API keys named by env var, for actors on other nodes (never written anywhere)."""
    out = {}
    for ep in config.endpoints:
        env = ep.key.env
        if env and os.environ.get(env):
            out[env] = os.environ[env]
    return out


@dataclass(slots=True)
class _Warm:
    """What was started before the plan was known (see _Session.run)."""

    config: WorkerConfig | None = None  #: what the workers run with
    started_ray: bool = False
    pool: RayWorkerPool | None = None
    dispatcher: Dispatcher | None = None
    error: RegenError | None = None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.started_ray:
            import ray

            ray.shutdown()
            self.started_ray = False


class _Session:
    """One driver session over one run directory; the dispatch loop's recorder."""

    def __init__(
        self,
        manifest: Manifest,
        rd: RunDir,
        opts: RunOptions,
        session: str,
        serving: Serving | None = None,
        tokenizer_class: str | None = None,
    ) -> None:
        self.m = manifest
        #: the endpoint check run_job made before the run directory was touched (else None)
        self.serving = serving
        #: how the actors' renderers load (the target tokenizer's class, checks.json; None:
        #: AutoTokenizer's) and render (run.json's ``render``, set once it is read)
        self.setup = RenderSetup(tokenizer_class)
        self.rd = rd
        self.opts = opts
        self.session = session
        self.stop = opts.stop or threading.Event()
        self.journal = Journal(rd, session)
        self.failure_log = FailureLog(rd, session)
        self.tracker: ProgressTracker | None = None
        self.failed_ids: dict[str, FailureRecord] = {}
        self.summary = JobSummary(run_dir=rd.uri, session=session, state="failed")
        self._last_progress = 0.0
        self.lengths: LengthModel | None = None  #: the dispatch order's estimate (learned)
        self.lock_lost: str = ""  #: set when another run took the lock over
        #: new attempts planned: sample id -> the counters of the answer each replaces
        self.replaces: dict[str, SourceCounts] = {}
        #: the new attempts that answer a source row changed in place (regen.store.stale):
        #: the answers they replace are stale, not counted as done
        self.superseding: set[str] = set()
        self.refused: set[str] = set()  #: endpoints announced as refused (one line each)
        self.stalled: set[str] = set()  #: endpoints announced as stalled, until back in
        eng = manifest.engine
        #: a full disk: the pause of the writes (regen.engine.diskfull)
        self.disk = DiskWait(eng.disk_full_wait_s, HOLD_PARTS * eng.part_size)
        #: failure records a full disk refused, written again when it has room
        self.failures_held: list[FailureRecord] = []

    # -- recording (regen.engine.dispatch.Recorder) --------------------------------------
    def store_native(self, sample: Sample) -> None:
        """A native sample's row, stored as it is (it never goes to a server)."""

        rows = [native_row(sample, self.m.target.family)]
        self.keep(CompletedSample(sample.id, sample.source, rows), output_tokens(rows))

    def keep(self, done: CompletedSample, tokens: list[int]) -> None:
        """Journal one completed sample (flushed), count it, write a part when one is due."""
        done.replaces = replaces = self.replaces.pop(done.sample_id, None)
        try:
            self.journal.append(done)  # kept in memory even when it raises
        except RunDirError as e:
            self._refused(e)
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
        if self.disk.paused:
            return  # tick retries the writes
        if self.journal.due(self.m.engine.part_size, self.m.engine.part_interval_s):
            self._roll_or_pause()

    def completed(self, out: PackedOutcome, sample: Any) -> None:
        """A sample the workers answered, as they packed it (regen.engine.wire)."""
        done = CompletedSample(out.sample_id, out.source, [], line=out.line, table=out.table,
                               own=out.counts)  # fmt: skip
        self.keep(done, out.tokens)

    def worker_lost(self, error: str) -> None:
        self.summary.workers_died += 1
        assert self.tracker is not None
        self.tracker.driver_error("worker_died", error[:300])

    def tick(self, snapshots: Callable[[], list[dict[str, Any]]]) -> None:
        if self.disk.paused:
            if self.disk.due():
                self._retry_writes()
        elif self.journal.due(self.m.engine.part_size, self.m.engine.part_interval_s):
            self._roll_or_pause()  # part_interval_s also applies while nothing completes
        self.progress(snapshots)

    def holding(self) -> bool:
        """A full disk holds as many answers in memory as it may: feed no new samples."""
        return self.disk.holding(self.journal.pending)

    # -- a full disk (regen.engine.diskfull) ----------------------------------------------
    def _roll_or_pause(self) -> None:
        try:
            self.roll()
        except RunDirError as e:
            self._refused(e)

    def _refused(self, error: RunDirError) -> None:
        """A write failed: a full disk pauses the writes (said once), anything else stops;
        so does a pause past engine.disk_full_wait_s (raises ``error``)."""
        if not self.disk.refused(error):
            return
        held = self.journal.pending
        log.warning("%s: the disk is full (%s); holding the answers in memory (%d now, no new "
                    "samples fed past %d) and writing again as soon as it has room, for up to "
                    "%g s (engine.disk_full_wait_s)", self.rd.uri, error, held,
                    self.disk.hold_max, self.disk.wait_s)  # fmt: skip
        if self.tracker is not None:
            self.tracker.driver_error("disk_full", str(error)[:300])

    def _retry_writes(self) -> None:
        """While the disk is full: write what waits (progress.json first, a cheap test of the
        disk; failure records; the journal's part); the first time all succeed, the pause
        ends."""
        assert self.tracker is not None
        held = self.journal.pending
        try:
            self.tracker.write()
            while self.failures_held:
                self.failure_log.append(self.failures_held[0])
                self.failures_held.pop(0)
            if self.journal.pending or self.journal.owed:
                self.roll()
        except RunDirError as e:
            self._refused(e)
            return
        took = self.disk.cleared()
        log.warning("%s: the disk has room again after %.1f s; %d answers held in memory "
                    "written, going on", self.rd.uri, took, held)  # fmt: skip

    def _settle(self) -> None:
        """At the end of a finished session: wait out a full disk (retrying its writes) until
        they all succeed; raises past engine.disk_full_wait_s, or at once when stopped."""
        while self.disk.paused:
            if self.stop.wait(self.disk.left_s()):
                assert self.disk.error is not None
                raise self.disk.error
            self._retry_writes()

    def roll(self) -> None:
        """Write the journal's samples as a part; save what the order learned with it."""
        self.journal.roll()
        if self.tracker is not None:
            self.tracker.part_written(self.journal.last_record)
        self.save_schedule()

    def save_schedule(self) -> None:
        if self.lengths is None:
            return
        try:
            layout.SCHEDULE_FILE.write(self.rd, schedule_record(self.lengths))
        except RegenError as e:  # an estimate; losing it costs only ordering
            log.warning("could not write %s: %s", layout.SCHEDULE, e)

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
        if self.failures_held:  # behind those a full disk refused, written with them
            self.failures_held.append(rec)
        else:
            try:
                self.failure_log.append(rec)
            except RunDirError as e:
                self._refused(e)  # raises unless the disk is full
                self.failures_held.append(rec)
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

    def progress(
        self, snapshots: Callable[[], list[dict[str, Any]]] | None = None, *, force: bool = False
    ) -> None:
        now = time.monotonic()
        if not force and now - self._last_progress < self.opts.progress_interval_s:
            return
        self._last_progress = now
        assert self.tracker is not None
        if snapshots is not None:
            snaps = snapshots()
            self.tracker.workers(snaps)
            self._announce_endpoints(snaps)
        if self.disk.paused:
            pass  # written with the retries of the writes (tick)
        else:
            try:
                self.tracker.write()
            except RunDirError as e:
                self._refused(e)
        if self.opts.on_progress is not None:
            self.opts.on_progress(self.tracker.snap)

    def _announce_endpoints(self, snaps: list[dict[str, Any]]) -> None:
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

    def on_lock_lost(self, message: str) -> None:
        self.lock_lost = message
        self.stop.set()

    # -- the session --------------------------------------------------------------------------
    def _read_state(self) -> tuple[DoneSet, SessionPlan, StaleSet]:
        """Fold journals, verify the parts, read failures, plan, find the stale answers (in a
        thread, see run)."""
        rd, m = self.rd, self.m
        with ThreadPoolExecutor(1, thread_name_prefix="regen-index") as ex:
            index = ex.submit(open_index, rd, m, self.opts.limit)  # beside the done-set
            recovered = recover(rd, skip=self.session)
            done = read_done(rd, repair=True, answers=bool(self.opts.retry_flagged))
            failures = read_failures(rd)
            opened = index.result()
        self.failed_ids = {k: v for k, v in failures.items() if k not in done}
        log.info("%s: %d samples done in %d parts (%d recovered from journals)", rd.uri,
                 len(done), done.parts, recovered)  # fmt: skip
        redo: dict[str, int] = {}
        if self.opts.retry_flagged:
            redo = select(done, RetryFlagged(self.opts.retry_flagged, self.opts.flagged_retries))
            self.replaces = {sid: done.flagged[sid].to_counts() for sid in redo}
        plan = plan_session(m, done.ids, self.failed_ids, limit=self.opts.limit,
                            retry_failed=self.opts.retry_failed, redo=redo, rd=rd,
                            opened=opened)  # fmt: skip
        stale, plan = self._supersede_stale(done, plan, redo)
        for sid in set(self.replaces) - plan.redo:
            del self.replaces[sid]  # no longer in the plan (e.g. --limit)
        return done, plan, stale

    def _supersede_stale(
        self, done: DoneSet, plan: SessionPlan, redo: dict[str, int]
    ) -> tuple[StaleSet, SessionPlan]:
        """The stored answers the plan just made no longer wants (regen.store.stale); a sample
        whose source row changed in place is planned again, as a new attempt one above its
        stale answer's (the plan is made again with it: its body is read from the sources)."""

        planned, why = recorded_plan(self.rd)
        if planned is None:
            if why:
                log.warning("%s: stale answers not looked for: %s", self.rd.uri, why)
            return StaleSet(), plan
        if self.failed_ids:  # failures of samples the plan no longer holds are not counted
            ids = list(self.failed_ids)
            held = pc.is_in(pa.array(ids, pa.string()), value_set=planned.column("id"))
            kept = [k for k, ok in zip(ids, held.to_pylist(), strict=True) if ok]
            self.failed_ids = {k: self.failed_ids[k] for k in kept}
        stale = stale_answers(self.rd, done, planned)
        done.keys = []  # the answers' hashes are not needed past this point
        if not len(stale):
            return stale, plan
        log.warning("%s: %s: not counted as done, never exported", self.rd.uri, stale.describe())
        changed = {sid: stale.answers[sid].attempt + 1 for sid in stale.ids("changed")}
        if changed:
            plan.spill.close()
            plan = plan_session(self.m, done.ids, self.failed_ids, limit=self.opts.limit,
                                retry_failed=self.opts.retry_failed, redo={**redo, **changed},
                                rd=self.rd, stale=frozenset(changed))  # fmt: skip
        for sid in plan.redo & set(changed):  # not done: what remains, not "retrying"
            self.replaces[sid] = stale.answers[sid].counts
            self.superseding.add(sid)
        return stale, plan

    def _likely_work(self) -> bool:
        """False when the last session finished (then nothing is started before the plan)."""
        return likely_work(self.rd, self.opts)

    def _warm_up(self) -> _Warm:
        """Endpoint check (unless run_job made it), Ray and the actors, while the plan is read
        (actors boot async)."""
        m = self.m
        warm = _Warm()
        try:
            serving = self.serving or check_serving(m, self.session)
        except RegenError as e:
            warm.error = e  # raised only if there is work to do
            return warm
        config = worker_config(m, [i.resolved() for i in serving.infos], self.setup)
        warm.config = config
        record_engines(self.rd, serving.records)
        warm.started_ray = connect_ray(self.opts.address, verbose=self.opts.verbose)
        conc = m.engine.concurrency
        level = logging.getLevelName(logging.getLogger("regen").getEffectiveLevel())
        warm.pool = RayWorkerPool(self.session, config, m.engine.workers, log_level=level,
                                  secrets=_secrets(config))  # fmt: skip
        prefetch = (self.opts.prefetch if self.opts.prefetch is not None
                    else max(2, (conc or DEFAULT_CONCURRENCY) // 4))  # fmt: skip
        warm.dispatcher = Dispatcher(warm.pool, m.engine.workers, prefetch=prefetch,
                                     max_respawns=self.opts.max_respawns,
                                     stop=self.stop)  # fmt: skip
        return warm

    def run(self) -> JobSummary:
        rd, m = self.rd, self.m
        run_info = prepare_run(rd, m, [e.url for e in m.endpoints], force=self.opts.force)
        if run_info.render != self.setup.arguments:
            log.warning("%s: this run started when regen rendered history tool-call arguments "
                        "as %s and keeps doing so; a new run renders them as %s, as the "
                        "engines hand them to the template (docs/targets.md)", rd.uri,
                        run_info.render, self.setup.arguments)  # fmt: skip
            self.setup = replace(self.setup, arguments=run_info.render)
        self.m = m = with_recorded_cut(rd, run_info, m)
        warm: _Warm | None = None
        with ThreadPoolExecutor(1, thread_name_prefix="regen-plan") as ex:
            reading = ex.submit(self._read_state)
            try:
                if self._likely_work() and not self.stop.is_set():
                    warm = self._warm_up()
                done, plan, stale = reading.result()
            except BaseException:
                if warm is not None:
                    warm.close()
                raise
        if warm is not None and (not plan.todo or self.stop.is_set()):
            warm.close()
            warm = None
        write_plan(rd, plan, self.session, m, self.opts.limit)
        self.tracker = ProgressTracker(
            rd,
            name=m.name,
            model=m.target.model,
            session=self.session,
            run_started_at=run_info.created_at,
            endpoints=[public_url(e.url) for e in m.endpoints],
        )
        failed_per_source: dict[str, int] = {}
        for f in self.failed_ids.values():
            if f.permanent:
                failed_per_source[f.source] = failed_per_source.get(f.source, 0) + 1
        self.tracker.carry_over(_last_progress(rd))
        self.tracker.start_from(done, plan.totals, failed_per_source, plan.retries, stale)
        for msg in done.damaged:
            self.tracker.driver_error("damaged_part", msg)
        log.info("session %s: %d samples to regenerate (%d new attempts of flagged samples), "
                 "%d native, %d permanent failures skipped", self.session, len(plan.todo),
                 sum(plan.retries.values()), len(plan.native), plan.skipped_failed)  # fmt: skip
        self.progress(force=True)
        state = "finished"
        for s in plan.native:
            self.store_native(s)
        with plan.spill:
            if plan.todo and not self.stop.is_set():
                regen_sources = {s.name for s in m.sources if s.mode == "regenerate"}
                saved = layout.SCHEDULE_FILE.read(rd)  # None when missing or unreadable
                self.lengths = LengthModel.from_done(done, regen_sources, saved)
                queue = WorkQueue(plan.todo, self.lengths, spill=plan.spill)
                plan.todo = QueueItems.of([])  # the queue holds them now
                warm = warm or self._warm_up()
                if warm.pool is not None:  # regen.engine.pool.RayWorkerPool.hold_for_rows
                    warm.pool.hold_for_rows = not plan.indexed
                state = self._regenerate(queue, warm)
            elif self.stop.is_set():
                state = "interrupted"
        self.summary.state = state
        return self.summary

    def _regenerate(self, queue: WorkQueue, warm: _Warm) -> str:
        try:
            if warm.error is not None:
                raise warm.error
            assert warm.dispatcher is not None and warm.pool is not None
            assert warm.config is not None
            d, eps = warm.dispatcher, warm.config.endpoints
            limits = [w.slots for w in d.workers]
            auto = worker_slots(eps, None, warm.pool.shares(0))
            reported = any(ep.max_running_requests for ep in eps)
            log.info("%d workers against %d endpoint(s); starting in-flight limits %s, %s",
                     len(limits), len(eps), limits,
                     describe_limit(self.m.engine.concurrency, auto, reported))  # fmt: skip
            cpu = time.process_time()
            try:
                state = d.run(queue, self)
            except RunIncompleteError as e:  # no endpoint left, all workers died: on the
                assert self.tracker is not None  # dashboard too; finish() keeps what is done
                self.tracker.driver_error(e.kind, str(e)[:300])
                raise
            finally:
                self.summary.workers_respawned = d.respawned
                used = self.summary.dispatch_cpu_s = time.process_time() - cpu
                n = self.summary.completed_now
                log.info("dispatch: %d samples completed in %d exchanges with the workers; "
                         "driver CPU %.2f s (%.2f ms per sample)", n, d.calls, used,
                         1000 * used / max(1, n))  # fmt: skip
            pool = warm.pool
            self.progress(lambda: pool.snapshots(d.live(), fresh=True), force=True)
            return state
        finally:
            warm.close()

    def finish(self, state: str) -> None:
        """Write what is buffered as a part, close the logs, final progress (a finished
        session waits out a full disk first: :meth:`_settle`)."""
        try:
            self.summary.parts_written = self.journal.parts_written
            if state == "finished":
                self._settle()
            self.journal.close()
            if self.tracker is not None:
                self.tracker.part_written(self.journal.last_record)
            self.summary.parts_written = self.journal.parts_written
            self.save_schedule()
        finally:
            self.failure_log.close()
            if self.tracker is not None:
                snap = self.tracker.snap
                self.summary.requests_sent = snap.requests.sent
                self.summary.sources = snap.model_copy(deep=True).sources
                self.tracker.write(state)
                if self.opts.on_progress is not None:
                    self.opts.on_progress(snap)


def run_job(manifest: Manifest, rd: RunDir, options: RunOptions | None = None) -> JobSummary:
    """Run (or resume) the job of ``manifest`` into the run directory ``rd`` (opened by the
    caller, ``RunDir.open(path, create=False)``: it is created here); returns how the session
    ended.

    Configuration problems (the run directory's path, source paths, tokenizer, template, then
    the endpoints: given, reachable, serving the target) are found before any source is read
    whole, before the run directory is touched and before Ray or any actor starts
    (:func:`regen.engine.failfast.preflight`, :func:`check_serving`; the tokenizer and
    template checks are skipped when an earlier session passed the same, the endpoint check
    when the last session finished and nothing asks for more).
    """
    opts = options or RunOptions()
    manifest = session_manifest(manifest, opts).with_family()
    checked: layout.ChecksRecord | None = None
    session = new_session_id()
    serving: Serving | None = None
    passed = _passed_checks(rd)
    if opts.preflight:
        check_run_dir(rd)
        checked = preflight(manifest, passed=passed)
        if any(s.mode == "regenerate" for s in manifest.sources) and likely_work(rd, opts):
            serving = check_serving(manifest, session)
    rd.create()
    tokenizer_class = checked.tokenizer_class if checked is not None else None
    sess = _Session(manifest, rd, opts, session, serving, tokenizer_class)
    lock = RunLock(rd, session, on_lost=sess.on_lock_lost)
    lock.acquire()
    lock.start_heartbeat()
    restore = _install_signal_handlers(sess.stop) if opts.handle_signals else None
    state = "failed"
    try:
        if checked is not None and checked is not passed:
            layout.CHECKS_FILE.write(rd, checked)
        state = sess.run().state
    finally:
        try:
            sess.finish(state)
        finally:
            lock.release()
            if restore is not None:
                restore()
    if sess.lock_lost:
        raise RegenError(sess.lock_lost)
    sess.summary.state = state
    return sess.summary


def _last_progress(rd: RunDir) -> ProgressSnapshot | None:
    """The progress file the last session left (None when there is none or it is damaged:
    then this session's counters start from zero, and say so)."""
    try:
        return layout.PROGRESS_FILE.read(rd)
    except RegenError as e:
        log.warning("%s: earlier sessions' request counters are lost: %s", rd.uri, e)
        return None


def _passed_checks(rd: RunDir) -> layout.ChecksRecord | None:
    """The checks an earlier session passed (checks.json), read without creating or locking
    anything; None when there is none."""
    try:
        return layout.CHECKS_FILE.read(rd)
    except (RegenError, OSError):
        return None


def _install_signal_handlers(stop: threading.Event) -> Callable[[], None] | None:
    """SIGINT/SIGTERM set ``stop`` (a second one raises KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        log.warning("%s: stopping; writing what is done (again to abort)",
                    signal.Signals(signum).name)  # fmt: skip
        stop.set()

    for sig in old:
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, h in old.items():
            signal.signal(sig, h)

    return restore
