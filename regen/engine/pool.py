"""Worker pools: where the dispatch loop's samples run. Owns no files.

:class:`WorkerPool` is what :mod:`regen.engine.dispatch` needs from workers: start one in a
slot, exchange a batch of samples for the outcomes finished since (one call in flight per
worker: :mod:`regen.engine.wire`), wait for replies, read counters, close.
:class:`RayWorkerPool` is the implementation: one Ray actor (:mod:`regen.engine.actor`) per
worker, spread over the cluster; a dead actor (or node) shows up as a lost worker. (The
dispatch loop's tests give it a pool of worker objects on an event loop instead:
tests/engine/_local_pool.py.)

A worker whose start fails is reported as lost with ``init_failed`` and a one-line ``error``
(``Type: message`` of the exception its constructor raised).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from regen.engine.actor import actor_class
from regen.engine.adaptive import split
from regen.engine.inputs import WorkerConfig
from regen.engine.lanes import worker_slots
from regen.engine.wire import Reply, unpack_reply
from regen.engine.worker import SampleOutcome, WorkerSnapshot
from regen.plan.packed import QueueItem

if TYPE_CHECKING:
    from ray import ObjectRef

log = logging.getLogger(__name__)

#: seconds an exchange waits for a first outcome before it answers with none (the dispatch
#: loop itself wakes every 0.5 s: regen.engine.dispatch.WAIT_S)
EXCHANGE_WAIT_S = 2.0


@dataclass(slots=True, eq=False)
class Worker:
    """One worker in a slot of the pool and the samples it holds."""

    index: int  #: slot number (a replacement takes the dead one's slot)
    handle: Any  #: the pool's object (a Ray actor handle, a SampleWorker)
    slots: int  #: its in-flight limit (it reports changes with each batch of outcomes)
    alive: bool = True
    name: str = ""
    #: samples handed to it and not finished, by id
    held: dict[str, QueueItem] = field(default_factory=dict)
    #: of those, the ones in their requests (holding or waiting for a slot) as of its last
    #: reply plus the ones sent since; -1: it does not say (then every held one counts)
    active: int = -1

    @property
    def load(self) -> int:
        """Samples that take or wait for a slot (those whose rows are being built do not)."""
        return len(self.held) if self.active < 0 else self.active


@dataclass(slots=True, eq=False)
class Finished:
    """One reply of one worker: a batch of outcomes, or the worker is gone."""

    worker: Worker
    outcomes: list[SampleOutcome] = field(default_factory=list)
    slots: int = 0  #: the worker's slots now (0: unknown)
    lost: bool = False  #: the worker died (every sample it held is lost)
    init_failed: bool = False  #: ... because it could not start
    error: str = ""  #: one line: why it was lost
    active: int = -1  #: its samples in their requests now (-1: it does not say)


class WorkerPool(Protocol):
    """What the dispatch loop needs from a set of workers."""

    def start(self, index: int, generation: int) -> Worker:
        """Start a worker in slot ``index`` (its ``generation``-th start overall)."""

    def pending(self, worker: Worker) -> bool:
        """Whether ``worker`` has an exchange in flight."""

    def exchange(self, worker: Worker, samples: list[QueueItem], low_water: int) -> None:
        """Hand ``samples`` to ``worker`` and ask for its outcomes (one call; the reply comes
        through :meth:`wait`). ``low_water``: see :meth:`regen.engine.wire.Mailbox.collect`."""

    def wait(self, timeout_s: float) -> list[Finished]:
        """Replies that came within ``timeout_s`` (at least one unless the time ran out or
        nothing is in flight), and the workers found dead."""

    def snapshots(self, workers: list[Worker], *, fresh: bool = False) -> list[WorkerSnapshot]:
        """The live workers' counters (SampleWorker.snapshot): the latest their replies
        carried, or asked now when ``fresh``; missing ones are skipped."""

    def cancel(self, workers: list[Worker]) -> None:
        """Best effort: stop the work of ``workers``."""

    def stop(self, worker: Worker) -> None:
        """Stop one worker (best effort; a lost one may be gone already)."""

    def close(self) -> None:
        """Stop every worker."""


class Replies:
    """What a pool keeps per worker: the exchange in flight, the latest counters."""

    def __init__(self) -> None:
        #: per worker, its exchange in flight (a Ray ObjectRef, or a future of a local pool)
        self.inflight: dict[Worker, Any] = {}
        self.snaps: dict[Worker, WorkerSnapshot] = {}

    def finished(self, w: Worker, reply: Reply) -> Finished:
        if reply.snapshot is not None:
            self.snaps[w] = reply.snapshot
        if reply.error:
            return Finished(w, lost=True, init_failed=reply.init_failed, error=reply.error)
        return Finished(w, unpack_reply(reply), slots=reply.slots, active=reply.active)

    def latest(self, workers: list[Worker]) -> list[WorkerSnapshot]:
        return [self.snaps[w] for w in workers if w.alive and w in self.snaps]

    def forget(self, w: Worker) -> None:
        self.inflight.pop(w, None)
        self.snaps.pop(w, None)


def one_line_error(text: str) -> str:
    """The last non-empty line of an error text (a traceback's ``Type: message``)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:500] if lines else "unknown error"


class RayWorkerPool:
    """Workers as Ray actors (``SPREAD`` over the cluster, one CPU-less actor each).

    Worker ``i`` starts at its share of each server's batch slots (``max_running_requests``
    split over ``n_workers``, when the servers report it). Each worker has at most one
    ``exchange`` call in flight.

    An actor loads its row builder (the tokenizer: seconds of CPU that hold the GIL) in a
    thread and can stream answers meanwhile. ``hold_for_rows`` makes it start its samples
    only once the builder is loaded: the driver sets it for a session that read its sources
    (a first session, which spends longer than the load reading them anyway), so the load does
    not slow the event loop while it streams; a resume from the plan index leaves it off, so
    its first requests go out before the load is done.
    """

    def __init__(
        self,
        session: str,
        config: WorkerConfig,
        n_workers: int,
        *,
        log_level: str = "INFO",
        secrets: dict[str, str] | None = None,
    ) -> None:
        """``config``: what every worker runs with (regen.engine.inputs); ``secrets``: API keys
        by env var name, for actors on other nodes (never written anywhere)."""
        self.session = session
        self.config = config
        self.n_workers = n_workers
        self.log_level = log_level
        self.secrets = dict(secrets or {})
        self._cls = actor_class()
        self.spawned: list[Any] = []
        self.hold_for_rows = False
        self._r = Replies()
        self._sent: list[ObjectRef[None]] = []  #: cancel refs not yet seen finished

    def shares(self, index: int) -> dict[str, int]:
        """Worker ``index``'s starting share of each server's batch slots (when reported)."""

        return {
            ep.url: split(ep.max_running_requests, self.n_workers, index)
            for ep in self.config.endpoints
            if ep.max_running_requests
        }

    def start(self, index: int, generation: int) -> Worker:

        name = f"regen-{self.session}-w{index}-{generation}"
        shares = self.shares(index)
        actor = self._cls.options(scheduling_strategy="SPREAD", name=name).remote(
            self.config, shares, log_level=self.log_level, secrets=self.secrets
        )
        self.spawned.append(actor)
        slots = worker_slots(self.config.endpoints, self.config.concurrency, shares)
        return Worker(index, actor, slots, name=name)

    def pending(self, worker: Worker) -> bool:
        return worker in self._r.inflight

    def exchange(self, worker: Worker, samples: list[QueueItem], low_water: int) -> None:
        call = worker.handle.exchange.remote(samples, EXCHANGE_WAIT_S, low_water,
                                             self.hold_for_rows)  # fmt: skip
        self._r.inflight[worker] = call

    def wait(self, timeout_s: float) -> list[Finished]:
        import ray
        from ray.exceptions import RayActorError, RayError

        self._drain_sent()
        owner = {ref: w for w, ref in self._r.inflight.items()}
        refs = list(owner)
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)  # busy: one call
        if not ready:
            ready, _ = ray.wait(refs, num_returns=1, timeout=timeout_s)
        out = []
        for ref in ready:
            w = owner[ref]
            self._r.inflight.pop(w, None)
            try:
                reply = ray.get(ref)
            except RayActorError as e:
                init = bool(getattr(e, "actor_init_failed", False))
                out.append(Finished(w, lost=True, init_failed=init, error=one_line_error(str(e))))
                log.debug("worker lost: %s", e)  # the full Ray text (traceback) at DEBUG
            except RayError as e:  # a reply that cannot be had: its samples go back
                out.append(Finished(w, lost=True, error=one_line_error(str(e))))
                log.debug("worker reply lost: %s", e)
            else:
                out.append(self._r.finished(w, Reply.from_wire(reply)))
        return out

    def _drain_sent(self) -> None:
        """Take the finished cancel calls' results (keeps Ray from logging a dead actor's
        errors as unhandled)."""
        import ray

        if not self._sent:
            return
        ready, self._sent = ray.wait(self._sent, num_returns=len(self._sent), timeout=0)
        for ref in ready:
            with contextlib.suppress(Exception):
                ray.get(ref)

    def snapshots(self, workers: list[Worker], *, fresh: bool = False) -> list[WorkerSnapshot]:
        import ray

        if not fresh:
            return self._r.latest(workers)
        refs = [w.handle.snapshot.remote() for w in workers if w.alive]
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=2)
        snaps = []
        for ref in ready:
            try:
                snaps.append(ray.get(ref))
            except Exception as e:  # a dying worker; progress must never stop the run
                log.debug("worker snapshot failed: %s", e)
        return snaps

    def cancel(self, workers: list[Worker]) -> None:
        for w in workers:
            with contextlib.suppress(Exception):
                self._sent.append(w.handle.cancel.remote())

    def stop(self, worker: Worker) -> None:
        import ray

        self._r.forget(worker)
        with contextlib.suppress(Exception):
            ray.kill(worker.handle)

    def close(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.get([a.close.remote() for a in self.spawned], timeout=5)
        for a in self.spawned:
            with contextlib.suppress(Exception):
                ray.kill(a)
        self.spawned = []
        self._r = Replies()
        self._sent = []
