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
N actors (:mod:`regen.engine.fleet`, started while the plan is read, with the one
:class:`~regen.engine.inputs.WorkerConfig` the driver cuts from the manifest and the endpoints
the check resolved) → the dispatch loop (:mod:`regen.engine.dispatch`: batches exchanged with
the actors) → every completed sample journaled at once by the session's recorder
(:mod:`regen.engine.recorder`); every ``part_size`` samples or ``part_interval_s`` the segment
becomes a Parquet part. SIGINT/SIGTERM stop feeding, write the buffered samples as a part,
release the lock and leave the state "interrupted"; rerunning the same command resumes. A full
disk pauses the writes, not the session (:mod:`regen.engine.writes`,
:mod:`regen.engine.diskfull`): the answers wait in memory and the writes are retried until
space returns or ``engine.disk_full_wait_s`` has passed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from types import FrameType

import pyarrow as pa
import pyarrow.compute as pc

from regen.client import EndpointInfo, check_endpoints
from regen.client.endpoints import EngineFields, engine_records
from regen.core.errors import ConfigError, RegenError
from regen.engine.failfast import check_run_dir, preflight
from regen.engine.fleet import Fleet
from regen.engine.inputs import worker_config
from regen.engine.options import JobSummary, RunOptions
from regen.engine.recorder import SessionRecorder
from regen.engine.schedule import LengthModel, WorkQueue
from regen.engine.tracker import ProgressTracker
from regen.engine.writes import SessionWrites
from regen.manifest import Endpoint, Manifest, public_url
from regen.plan.attempts import RetryFlagged, select
from regen.plan.packed import QueueItems
from regen.plan.session import SessionPlan, plan_session, write_plan
from regen.sources import source_set
from regen.store import layout
from regen.store.doneset import DoneSet, read_done
from regen.store.failures import read_failures
from regen.store.lock import RunLock
from regen.store.planned import open_index, recorded_plan
from regen.store.progress import ProgressSnapshot
from regen.store.run import new_session_id, prepare_run, record_engines, with_recorded_cut
from regen.store.rundir import RunDir
from regen.store.segments import recover
from regen.store.stale import StaleSet, stale_answers
from regen.template.render import RenderSetup

log = logging.getLogger(__name__)

__all__ = ["JobSummary", "RunOptions", "check_serving", "connect_ray", "run_job"]


@dataclass(slots=True)
class Serving:
    """The usable endpoints (:func:`regen.client.check_endpoints`) and what run.json's
    ``engines`` records of them."""

    infos: list[EndpointInfo]
    records: dict[str, EngineFields]


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
    update: dict[str, object] = {}
    if opts.endpoints:
        keyed = opts.api_key_env is not None or opts.api_key_file is not None
        by_url = {} if keyed else {e.url: e for e in manifest.endpoints}
        update["endpoints"] = [
            by_url.get(u.rstrip("/"))
            or Endpoint(url=u, api_key_env=opts.api_key_env, api_key_file=opts.api_key_file)
            for u in opts.endpoints
        ]
    eng: dict[str, object] = {}
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


class _Session:
    """One driver session over one run directory: its start (the run record, the plan, the
    workers started while the plan is read), then the dispatch (:class:`Fleet`) reporting to
    its recorder (:class:`SessionRecorder`, which also ends it: :meth:`finish`)."""

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
        #: what planning reads of the manifest: its sources (regen.sources.sourceset)
        self.sources = source_set(manifest)
        #: the endpoint check run_job made before the run directory was touched (else None)
        self.serving = serving
        #: how the actors' renderers load (the target tokenizer's class, checks.json; None:
        #: AutoTokenizer's) and render (run.json's ``render``, set once it is read)
        self.setup = RenderSetup(tokenizer_class)
        self.rd = rd
        self.opts = opts
        self.session = session
        self.stop = opts.stop or threading.Event()
        self.summary = JobSummary(run_dir=rd.uri, session=session, state="failed")
        self.writes = SessionWrites(rd, session, manifest.engine, self.stop)
        self.rec = SessionRecorder(self.writes, self.summary, opts, manifest.target.family)
        self.lock_lost: str = ""  #: set when another run took the lock over

    def on_lock_lost(self, message: str) -> None:
        self.lock_lost = message
        self.stop.set()

    def finish(self, state: str) -> None:
        """The session's end (:meth:`SessionRecorder.finish`)."""
        self.rec.finish(state)

    # -- the start ----------------------------------------------------------------------
    def _read_state(self) -> tuple[DoneSet, SessionPlan, StaleSet]:
        """Fold journals, verify the parts, read failures, plan, find the stale answers (in a
        thread, see run)."""
        rd, sources = self.rd, self.sources
        with ThreadPoolExecutor(1, thread_name_prefix="regen-index") as ex:
            index = ex.submit(open_index, rd, sources, self.opts.limit)  # beside the done-set
            recovered = recover(rd, skip=self.session)
            done = read_done(rd, repair=True, answers=bool(self.opts.retry_flagged))
            failures = read_failures(rd)
            opened = index.result()
        self.rec.failed_ids = {k: v for k, v in failures.items() if k not in done}
        log.info("%s: %d samples done in %d parts (%d recovered from journals)", rd.uri,
                 len(done), done.parts, recovered)  # fmt: skip
        redo: dict[str, int] = {}
        if self.opts.retry_flagged:
            redo = select(done, RetryFlagged(self.opts.retry_flagged, self.opts.flagged_retries))
            self.rec.replaces = {sid: done.flagged[sid].to_counts() for sid in redo}
        plan = plan_session(sources, done.ids, self.rec.failed_ids, limit=self.opts.limit,
                            retry_failed=self.opts.retry_failed, redo=redo, rd=rd,
                            opened=opened)  # fmt: skip
        stale, plan = self._supersede_stale(done, plan, redo)
        for sid in set(self.rec.replaces) - plan.redo:
            del self.rec.replaces[sid]  # no longer in the plan (e.g. --limit)
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
        if self.rec.failed_ids:  # failures of samples the plan no longer holds are not counted
            ids = list(self.rec.failed_ids)
            held = pc.is_in(pa.array(ids, pa.string()), value_set=planned.column("id"))
            kept = [k for k, ok in zip(ids, held.to_pylist(), strict=True) if ok]
            self.rec.failed_ids = {k: self.rec.failed_ids[k] for k in kept}
        stale = stale_answers(self.rd, done, planned)
        done.keys = []  # the answers' hashes are not needed past this point
        if not len(stale):
            return stale, plan
        log.warning("%s: %s: not counted as done, never exported", self.rd.uri, stale.describe())
        changed = {sid: stale.answers[sid].attempt + 1 for sid in stale.ids("changed")}
        if changed:
            plan.spill.close()
            plan = plan_session(self.sources, done.ids, self.rec.failed_ids,
                                limit=self.opts.limit, retry_failed=self.opts.retry_failed,
                                redo={**redo, **changed}, rd=self.rd,
                                stale=frozenset(changed))  # fmt: skip
        for sid in plan.redo & set(changed):  # not done: what remains, not "retrying"
            self.rec.replaces[sid] = stale.answers[sid].counts
            self.rec.superseding.add(sid)
        return stale, plan

    def _warm_up(self) -> Fleet:
        """Endpoint check (unless run_job made it), Ray and the actors, while the plan is read
        (actors boot async)."""
        m = self.m
        fleet = Fleet()
        try:
            serving = self.serving or check_serving(m, self.session)
        except RegenError as e:
            fleet.error = e  # raised only if there is work to do
            return fleet
        config = worker_config(m, [i.resolved() for i in serving.infos], self.setup)
        record_engines(self.rd, serving.records)
        fleet.started_ray = connect_ray(self.opts.address, verbose=self.opts.verbose)
        fleet.start(self.session, config, m.engine.workers, prefetch=self.opts.prefetch,
                    max_respawns=self.opts.max_respawns, stop=self.stop)  # fmt: skip
        return fleet

    def _prepare(self) -> layout.RunRecord:
        """run.json and manifest.yaml; the session follows how the run renders and cuts."""
        rd, m = self.rd, self.m
        run_info = prepare_run(rd, m, [e.url for e in m.endpoints], force=self.opts.force)
        if run_info.render != self.setup.arguments:
            log.warning("%s: this run started when regen rendered history tool-call arguments "
                        "as %s and keeps doing so; a new run renders them as %s, as the "
                        "engines hand them to the template (docs/targets.md)", rd.uri,
                        run_info.render, self.setup.arguments)  # fmt: skip
            self.setup = replace(self.setup, arguments=run_info.render)
        self.m = with_recorded_cut(rd, run_info, m)
        return run_info

    def _plan_and_warm(self) -> tuple[DoneSet, SessionPlan, StaleSet, Fleet | None]:
        """The state and plan (read in a thread) and, when there is likely work, the workers
        started meanwhile (closed again when the plan has none)."""
        warm: Fleet | None = None
        with ThreadPoolExecutor(1, thread_name_prefix="regen-plan") as ex:
            reading = ex.submit(self._read_state)
            try:
                if likely_work(self.rd, self.opts) and not self.stop.is_set():
                    warm = self._warm_up()
                done, plan, stale = reading.result()
            except BaseException:
                if warm is not None:
                    warm.close()
                raise
        if warm is not None and (not plan.todo or self.stop.is_set()):
            warm.close()
            warm = None
        return done, plan, stale, warm

    def _begin(
        self, run_info: layout.RunRecord, done: DoneSet, plan: SessionPlan, stale: StaleSet
    ) -> None:
        """The plan written, the counters started from what is done, the first progress."""
        rd, m = self.rd, self.m
        write_plan(rd, plan, self.session, self.sources.base_dir, self.opts.limit)
        tracker = ProgressTracker(rd, name=m.name, model=m.target.model, session=self.session,
                                  run_started_at=run_info.created_at,
                                  endpoints=[public_url(e.url) for e in m.endpoints])  # fmt: skip
        self.rec.begin(tracker)
        failed_per_source: dict[str, int] = {}
        for f in self.rec.failed_ids.values():
            if f.permanent:
                failed_per_source[f.source] = failed_per_source.get(f.source, 0) + 1
        tracker.carry_over(_last_progress(rd))
        tracker.start_from(done, plan.totals, failed_per_source, plan.retries, stale)
        for msg in done.damaged:
            tracker.driver_error("damaged_part", msg)
        log.info("session %s: %d samples to regenerate (%d new attempts of flagged samples), "
                 "%d native, %d permanent failures skipped", self.session, len(plan.todo),
                 sum(plan.retries.values()), len(plan.native), plan.skipped_failed)  # fmt: skip
        self.rec.progress(force=True)

    def run(self) -> JobSummary:
        run_info = self._prepare()
        done, plan, stale, warm = self._plan_and_warm()
        self._begin(run_info, done, plan, stale)
        state = "finished"
        for s in plan.native:
            self.rec.store_native(s)
        with plan.spill:
            if plan.todo and not self.stop.is_set():
                state = self._regenerate(done, plan, warm)
            elif self.stop.is_set():
                state = "interrupted"
        self.summary.state = state
        return self.summary

    def _regenerate(self, done: DoneSet, plan: SessionPlan, warm: Fleet | None) -> str:
        """The dispatch: the plan's samples in the order the lengths learned so far give,
        through the workers (started now unless they were)."""
        regen_sources = {s.name for s in self.sources.sources if s.mode == "regenerate"}
        saved = layout.SCHEDULE_FILE.read(self.rd)  # None when missing or unreadable
        self.writes.lengths = lengths = LengthModel.from_done(done, regen_sources, saved)
        queue = WorkQueue(plan.todo, lengths, spill=plan.spill)
        plan.todo = QueueItems.of([])  # the queue holds them now
        fleet = warm or self._warm_up()
        if fleet.pool is not None:  # regen.engine.pool.RayWorkerPool.hold_for_rows
            fleet.pool.hold_for_rows = not plan.indexed
        return fleet.run(queue, self.rec)


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

    def handler(signum: int, frame: FrameType | None) -> None:
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
