"""The driver: plans the session, feeds Ray actors per sample, journals what completes.

Files it writes (through :mod:`regen.store`): lock.json (held for the session), run.json and
manifest.yaml (:func:`regen.store.run.prepare_run`), plan.json (per-source totals of this
session), journal/ and parts/ (:class:`regen.store.journal.Journal`), failures/, progress.json
(:class:`regen.engine.tracker.ProgressTracker`, every ~2 s and once at the end).

Flow: lock → fingerprint → fold leftover journals → done-set from the parts → read the samples
(skip done ones and recorded permanent failures unless ``retry_failed``) → native rows are
journaled directly → endpoint check → N actors, each kept fed with up to its concurrency plus a
prefetch margin of single-sample work items (no batches, no barriers) → every completed sample
is journaled at once; every ``part_size`` samples or ``part_interval_s`` the segment becomes a
Parquet part. SIGINT/SIGTERM stop feeding, write the buffered samples as a part, release the
lock and leave the state "interrupted"; rerunning the same command resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from regen.engine.adaptive import split
from regen.engine.schedule import SCHEDULE_FILE, LengthModel, PackedSample, Spill, WorkQueue
from regen.engine.tracker import ProgressTracker
from regen.engine.worker import SampleOutcome
from regen.errors import RegenError
from regen.manifest import Endpoint, Manifest
from regen.progress import PROGRESS_FILE, ProgressSnapshot
from regen.sample import Sample
from regen.store.journal import (
    CompletedSample,
    DoneSet,
    FailureLog,
    FailureRecord,
    Journal,
    read_done,
    read_failures,
    recover,
)
from regen.store.run import RunLock, new_session_id, prepare_run, public_url
from regen.store.rundir import RunDir

log = logging.getLogger(__name__)

PLAN_FILE = "plan.json"


@dataclass(slots=True)
class RunOptions:
    """How one session runs; none of this is part of the fingerprint."""

    endpoints: list[str] | None = None  #: replaces the manifest's endpoint URLs
    workers: int | None = None  #: Ray actors (default: manifest engine.workers)
    concurrency: int | None = None  #: requests in flight per actor (default: engine.concurrency)
    limit: int | None = None  #: keep the first N samples (after sources' own limits)
    retry_failed: bool = False  #: request recorded permanent failures again
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


@dataclass(slots=True)
class JobSummary:
    """How a session ended."""

    run_dir: str
    session: str
    state: str  #: "finished" | "interrupted" | "failed"
    total: int = 0  #: samples planned (all sessions)
    done: int = 0  #: samples stored (all sessions)
    completed_now: int = 0  #: samples completed in this session
    failed_permanent: int = 0  #: permanent failures on record (not done)
    failed_transient: int = 0  #: samples of this session that ran out of retries
    parts_written: int = 0
    requests_sent: int = 0
    workers_died: int = 0  #: actors lost this session (their samples were requeued)
    workers_respawned: int = 0  #: replacement actors started
    per_source: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass(slots=True)
class _Plan:
    todo: list[PackedSample]  #: bodies in ``spill``
    native: list[Sample]
    totals: dict[str, tuple[int, bool]]
    skipped_failed: int
    spill: Spill


def _apply_options(manifest: Manifest, opts: RunOptions) -> Manifest:
    update: dict[str, Any] = {}
    if opts.endpoints:
        by_url = {e.url: e for e in manifest.endpoints}
        eps = [by_url.get(u.rstrip("/")) or Endpoint(url=u) for u in opts.endpoints]
        update["endpoints"] = eps
    eng: dict[str, Any] = {}
    if opts.workers is not None:
        eng["workers"] = opts.workers
    if opts.concurrency is not None:
        eng["concurrency"] = opts.concurrency
    if eng:
        update["engine"] = manifest.engine.model_copy(update=eng)
    return manifest.model_copy(update=update) if update else manifest


def _native_check(manifest: Manifest) -> Callable[[Sample], str | None] | None:
    if not any(s.mode == "native" for s in manifest.sources):
        return None
    from regen.native import VocabInfo, validate_native

    vocab = VocabInfo.from_dir(
        manifest.resolve(manifest.target.tokenizer),
        trust_remote_code=manifest.target.trust_remote_code,
    )
    return lambda s: validate_native(s, vocab)


def plan_session(
    manifest: Manifest, done: set[str], failures: dict[str, FailureRecord], opts: RunOptions
) -> _Plan:
    """Read the samples; split them into work (regenerate), native rows and already-done.
    The bodies of the work are spilled to a temporary file (closed with the plan)."""
    from regen.sources import read_samples

    samples: Iterator[Sample] = read_samples(manifest, None, _native_check(manifest))
    spill = Spill()
    if opts.limit is not None:
        samples = itertools.islice(samples, opts.limit)
    todo: list[PackedSample] = []
    native: list[Sample] = []
    totals: dict[str, list[Any]] = {
        s.name: [0, s.mode == "regenerate"] for s in manifest.sources
    }  # fmt: skip
    seen: set[str] = set()
    skipped = 0
    for s in samples:
        if s.id in seen:
            log.warning("sample id %s appears twice; keeping the first", s.id)
            continue
        seen.add(s.id)
        totals[s.source][0] += 1
        if s.id in done:
            continue
        f = failures.get(s.id)
        if f is not None and f.permanent and not opts.retry_failed:
            skipped += 1
            continue
        if s.mode == "native":
            native.append(s)
        else:
            todo.append(PackedSample.pack(s, spill))  # the plan of a big run stays small
    return _Plan(todo, native, {k: (v[0], v[1]) for k, v in totals.items()}, skipped, spill)


def connect_ray(address: str | None) -> bool:
    """Join ``address`` / $RAY_ADDRESS, else start a quiet local Ray; True if we started it."""
    import ray

    if ray.is_initialized():
        return False
    addr = address or os.environ.get("RAY_ADDRESS") or None
    if addr:
        ray.init(address=addr, logging_level=logging.WARNING, log_to_driver=True)
    else:
        ray.init(
            include_dashboard=False,
            logging_level=logging.WARNING,
            _node_ip_address="127.0.0.1",
            num_cpus=max(2, os.cpu_count() or 2),
        )
    return True


def _secrets(manifest: Manifest) -> dict[str, str]:
    """API keys named by env var, for actors on other nodes (never written anywhere)."""
    out = {}
    for e in manifest.endpoints:
        if e.api_key_env and os.environ.get(e.api_key_env):
            out[e.api_key_env] = os.environ[e.api_key_env]
    return out


@dataclass(slots=True)
class _Worker:
    """One actor and the work items it holds."""

    index: int  #: slot number (a replacement takes the dead one's slot)
    actor: Any
    slots: int  #: the actor's in-flight limit (it reports changes with each outcome)
    load: int = 0
    alive: bool = True


class _WorkerPool:
    """The session's actors; a dead one is replaced while the respawn budget lasts."""

    def __init__(
        self, sess: _Session, infos: list[Any], conc: int, prefetch: int, n_workers: int
    ) -> None:
        from regen.engine.actor import MAX_CALLS_PER_ACTOR, actor_class

        self.sess = sess
        self.prefetch = prefetch
        self.infos = infos
        self.conc = conc
        self.n_workers = n_workers
        self._cls = actor_class(MAX_CALLS_PER_ACTOR)
        level = logging.getLevelName(logging.getLogger("regen").getEffectiveLevel())
        self._args = (sess.m, infos, conc, level, _secrets(sess.m))
        budget = sess.opts.max_respawns
        self.respawns_left = budget if budget is not None else max(3, 2 * n_workers)
        self.deaths = 0
        self.spawned: list[Any] = []
        self.workers = [self._spawn(i) for i in range(n_workers)]

    def shares(self, index: int) -> dict[str, int]:
        """Worker ``index``'s starting share of each server's batch slots (when reported)."""
        return {
            i.url: split(i.max_running_requests, self.n_workers, index)
            for i in self.infos
            if getattr(i, "max_running_requests", None)
        }

    def _spawn(self, index: int) -> _Worker:
        from regen.engine.worker import starting_limits

        shares = self.shares(index)
        actor = self._cls.options(
            scheduling_strategy="SPREAD",
            name=f"regen-{self.sess.session}-w{index}-{len(self.spawned)}",
        ).remote(*self._args, shares)
        self.spawned.append(actor)
        slots = sum(starting_limits(self.infos, self.conc, shares).values())
        return _Worker(index, actor, slots)

    def least_loaded(self) -> _Worker | None:
        """The live worker with the most room below its slots + prefetch, if any has room."""
        best, room = None, 0
        for w in self.workers:
            r = w.slots + self.prefetch - w.load
            if w.alive and r > room:
                best, room = w, r
        return best

    def live_actors(self) -> list[Any]:
        return [w.actor for w in self.workers if w.alive]

    def died(self, w: _Worker, err: BaseException, requeued: int) -> None:
        """Worker ``w`` is gone: its samples are back in the queue; start a replacement."""
        w.alive = False
        self.deaths += 1
        self.sess.summary.workers_died += 1
        assert self.sess.tracker is not None
        self.sess.tracker.driver_error("worker_died", str(err)[:300])
        if self.respawns_left > 0:
            self.respawns_left -= 1
            self.workers[w.index] = self._spawn(w.index)
            self.sess.summary.workers_respawned += 1
            log.error("worker %d died; %d samples requeued, replacement started (%d respawns "
                      "left): %s", w.index, requeued, self.respawns_left, err)  # fmt: skip
            return
        log.error("worker %d died; %d samples requeued to the others, respawn budget spent: %s",
                  w.index, requeued, err)  # fmt: skip
        if not any(x.alive for x in self.workers):
            raise RegenError(
                f"all workers died ({self.deaths} deaths, respawn budget spent); "
                "rerun the command to resume"
            ) from err

    def close(self) -> None:
        import ray

        live = self.live_actors()
        with contextlib.suppress(Exception):
            ray.get([a.close.remote() for a in live], timeout=5)
        for a in self.spawned:
            with contextlib.suppress(Exception):
                ray.kill(a)


@dataclass(slots=True)
class _Warm:
    """What was started before the plan was known (see _Session.run)."""

    infos: list[Any] = field(default_factory=list)
    started_ray: bool = False
    pool: _WorkerPool | None = None
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
    """One driver session over one run directory."""

    def __init__(self, manifest: Manifest, rd: RunDir, opts: RunOptions, session: str) -> None:
        self.m = manifest
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

    # -- recording --------------------------------------------------------------------------
    def completed(self, sample_id: str, source: str, rows: list[dict[str, Any]]) -> None:
        self.journal.append(CompletedSample(sample_id, source, rows))
        prev = self.failed_ids.pop(sample_id, None)
        assert self.tracker is not None
        self.tracker.sample_done(source, rows, was_failed=prev is not None and prev.permanent)
        self.summary.completed_now += 1
        if self.journal.due(self.m.engine.part_size, self.m.engine.part_interval_s):
            self.roll()

    def roll(self) -> None:
        """Write the journal's samples as a part; save what the order learned with it."""
        self.journal.roll()
        self.save_schedule()

    def save_schedule(self) -> None:
        if self.lengths is None:
            return
        try:
            self.rd.write_json_atomic(SCHEDULE_FILE, self.lengths.state())
        except OSError as e:  # an estimate; losing it costs only ordering
            log.warning("could not write %s: %s", SCHEDULE_FILE, e)

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
        self.failure_log.append(rec)
        prev = self.failed_ids.get(out.sample_id)
        self.failed_ids[out.sample_id] = rec
        assert self.tracker is not None
        self.tracker.sample_failed(
            out, newly_permanent=rec.permanent and not (prev and prev.permanent)
        )
        if not rec.permanent:
            self.summary.failed_transient += 1
        log.warning("sample %s failed (%s%s): %s", out.sample_id, out.kind,
                    "" if rec.permanent else ", retried next run", out.message[:300])  # fmt: skip

    def progress(self, actors: list[Any] | None = None, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_progress < self.opts.progress_interval_s:
            return
        self._last_progress = now
        assert self.tracker is not None
        if actors:
            import ray

            refs = [a.snapshot.remote() for a in actors]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=2)
            snaps = []
            for ref in ready:
                try:
                    snaps.append(ray.get(ref))
                except Exception as e:  # a dying worker; progress must never stop the run
                    log.debug("worker snapshot failed: %s", e)
            self.tracker.workers(snaps)
        self.tracker.write()
        if self.opts.on_progress is not None:
            self.opts.on_progress(self.tracker.snap)

    # -- the session --------------------------------------------------------------------------
    def _read_state(self) -> tuple[DoneSet, _Plan]:
        """Fold journals, read the done-set and failures, plan (run in a thread, see run)."""
        rd, m = self.rd, self.m
        recovered = recover(rd, skip=self.session)
        done = read_done(rd)
        failures = read_failures(rd)
        self.failed_ids = {k: v for k, v in failures.items() if k not in done}
        log.info("%s: %d samples done in %d parts (%d recovered from journals)", rd.uri,
                 len(done), done.parts, recovered)  # fmt: skip
        return done, plan_session(m, done.ids, self.failed_ids, self.opts)

    def _likely_work(self) -> bool:
        """False when the last session finished (then nothing is started before the plan)."""
        try:
            last = self.rd.read_json(PROGRESS_FILE) or {}
        except Exception:  # a torn or missing snapshot says nothing
            return True
        return self.opts.retry_failed or last.get("state") != "finished"

    def _warm_up(self) -> _Warm:
        """Endpoint check, Ray and the actors, while the plan is read (actors boot async)."""
        from regen.client import check_endpoints

        m = self.m
        warm = _Warm()
        try:
            warm.infos = asyncio.run(
                check_endpoints(
                    m.endpoints, m.target.model, base_dir=m.base_dir, seed=m.sampling.seed
                )
            )
        except RegenError as e:
            warm.error = e  # raised only if there is work to do
            return warm
        warm.started_ray = connect_ray(self.opts.address)
        warm.pool = self._pool(warm.infos, m.engine.workers)
        return warm

    def _pool(self, infos: list[Any], n_workers: int) -> _WorkerPool:
        conc = self.m.engine.concurrency
        prefetch = self.opts.prefetch if self.opts.prefetch is not None else max(2, conc // 4)
        return _WorkerPool(self, infos, conc, prefetch, n_workers)

    def run(self) -> JobSummary:
        rd, m = self.rd, self.m
        run_info = prepare_run(rd, m, [e.url for e in m.endpoints], force=self.opts.force)
        warm: _Warm | None = None
        with ThreadPoolExecutor(1, thread_name_prefix="regen-plan") as ex:
            reading = ex.submit(self._read_state)
            try:
                if self._likely_work() and not self.stop.is_set():
                    warm = self._warm_up()
                done, plan = reading.result()
            except BaseException:
                if warm is not None:
                    warm.close()
                raise
        if warm is not None and (not plan.todo or self.stop.is_set()):
            warm.close()
            warm = None
        todo_n: dict[str, int] = {}
        todo_turns: dict[str, int] = {}
        for p in plan.todo:
            todo_n[p.source] = todo_n.get(p.source, 0) + 1
            todo_turns[p.source] = todo_turns.get(p.source, 0) + p.turns_to_regenerate()
        rd.write_json_atomic(
            PLAN_FILE,
            {name: {"total": t, "regenerate": r,
                    "native": sum(1 for s in plan.native if s.source == name),
                    # samples still to regenerate and their requests (the ETA's turns/sample)
                    "regenerate_todo": todo_n.get(name, 0),
                    "regenerate_turns": todo_turns.get(name, 0)}
             for name, (t, r) in plan.totals.items()},
        )  # fmt: skip
        self.tracker = ProgressTracker(
            rd,
            name=m.name,
            model=m.target.model,
            session=self.session,
            run_started_at=float(run_info.get("created_at", time.time())),
            endpoints=[public_url(e.url) for e in m.endpoints],
        )
        failed_per_source: dict[str, int] = {}
        for f in self.failed_ids.values():
            if f.permanent:
                failed_per_source[f.source] = failed_per_source.get(f.source, 0) + 1
        self.tracker.start_from(done, plan.totals, failed_per_source)
        log.info("session %s: %d samples to regenerate, %d native, %d permanent failures skipped",
                 self.session, len(plan.todo), len(plan.native), plan.skipped_failed)  # fmt: skip
        self.progress(force=True)
        state = "finished"
        if plan.native:
            from regen.rows import native_row

            for s in plan.native:
                self.completed(s.id, s.source, [native_row(s)])
        with plan.spill:
            if plan.todo and not self.stop.is_set():
                regen_sources = {s.name for s in m.sources if s.mode == "regenerate"}
                saved = self.rd.read_json(SCHEDULE_FILE)  # None when missing or torn
                self.lengths = LengthModel.from_done(done, regen_sources, saved)
                queue = WorkQueue(plan.todo, self.lengths, spill=plan.spill)
                plan.todo.clear()  # the queue holds them now
                state = self._regenerate(queue, warm or self._warm_up())
            elif self.stop.is_set():
                state = "interrupted"
        self.summary.state = state
        return self.summary

    def _regenerate(self, queue: WorkQueue, warm: _Warm) -> str:
        try:
            if warm.error is not None:
                raise warm.error
            assert warm.pool is not None
            pool = warm.pool
            limits = [w.slots for w in pool.workers]
            log.info("%d workers against %d endpoint(s); starting in-flight limits %s",
                     len(limits), len(warm.infos), limits)  # fmt: skip
            return self._feed(pool, queue)
        finally:
            warm.close()

    def _feed(self, pool: _WorkerPool, queue: WorkQueue) -> str:
        import ray
        from ray.exceptions import RayActorError, TaskCancelledError

        outstanding: dict[Any, tuple[_Worker, Sample | PackedSample]] = {}
        while True:
            # feed: keep every live actor at `cap` outstanding work items, longest first
            while queue and not self.stop.is_set():
                w = pool.least_loaded()
                if w is None:
                    break
                s = queue.pop()
                assert s is not None
                outstanding[w.actor.process.remote(s)] = (w, s)
                w.load += 1
            if self.stop.is_set():
                for ref in outstanding:
                    with contextlib.suppress(Exception):
                        ray.cancel(ref)
                return "interrupted"
            if not outstanding:
                break
            refs = list(outstanding)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)  # busy: one call
            if not ready:
                ready, _ = ray.wait(refs, num_returns=1, timeout=0.5)
            for ref in ready:
                if ref not in outstanding:  # taken back when its worker died
                    continue
                w, s = outstanding.pop(ref)
                w.load -= 1
                try:
                    out: SampleOutcome = ray.get(ref)
                except (RayActorError, TaskCancelledError) as e:
                    if self.stop.is_set():
                        continue
                    lost = [r for r, (ow, _) in outstanding.items() if ow is w]
                    for r in lost:
                        queue.push(outstanding.pop(r)[1])
                    queue.push(s)
                    pool.died(w, e, len(lost) + 1)
                    continue
                if out.slots:
                    w.slots = out.slots
                if out.status == "done":
                    self.completed(out.sample_id, out.source, out.rows)
                    queue.observe(out.source,
                                  [int(r.get("completion_tokens") or 0) for r in out.rows],
                                  s.original_chars())  # fmt: skip
                else:
                    self.failed(out)
            if self.journal.due(self.m.engine.part_size, self.m.engine.part_interval_s):
                self.roll()  # part_interval_s also applies while nothing completes
            self.progress(pool.live_actors())
        self.progress(pool.live_actors(), force=True)
        return "finished"

    def finish(self, state: str) -> None:
        """Write what is buffered as a part, close the logs, final progress."""
        try:
            self.summary.parts_written = self.journal.parts_written
            self.journal.close()
            self.summary.parts_written = self.journal.parts_written
            self.save_schedule()
        finally:
            self.failure_log.close()
            if self.tracker is not None:
                snap = self.tracker.snap
                self.summary.total = snap.total
                self.summary.done = snap.done
                self.summary.failed_permanent = snap.failed
                self.summary.requests_sent = snap.requests.sent
                self.summary.per_source = {
                    k: {"total": v.total, "done": v.done, "failed": v.failed,
                        "truncated": v.truncated, "completion_tokens": v.completion_tokens}
                    for k, v in snap.sources.items()
                }  # fmt: skip
                self.tracker.write(state)
                if self.opts.on_progress is not None:
                    self.opts.on_progress(snap)


def run_job(manifest: Manifest, run_dir: str, options: RunOptions | None = None) -> JobSummary:
    """Run (or resume) the job of ``manifest`` into ``run_dir``; returns how the session ended."""
    opts = options or RunOptions()
    manifest = _apply_options(manifest, opts)
    rd = RunDir.open(run_dir)
    session = new_session_id()
    lock = RunLock(rd, session)
    lock.acquire()
    lock.start_heartbeat()
    sess = _Session(manifest, rd, opts, session)
    restore = _install_signal_handlers(sess.stop) if opts.handle_signals else None
    state = "failed"
    try:
        state = sess.run().state
    finally:
        try:
            sess.finish(state)
        finally:
            lock.release()
            if restore is not None:
                restore()
    sess.summary.state = state
    return sess.summary


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
