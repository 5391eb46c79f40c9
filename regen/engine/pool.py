"""Worker pools: where the dispatch loop's samples run. Owns no files.

:class:`WorkerPool` is what :mod:`regen.engine.dispatch` needs from workers: start one in a
slot, hand it a sample, wait for outcomes, read counters, close. Two implementations:

- :class:`RayWorkerPool`: one Ray actor (:mod:`regen.engine.actor`) per worker, spread over
  the cluster; a dead actor (or node) shows up as a lost ticket.
- :class:`LocalWorkerPool`: :class:`~regen.engine.worker.SampleWorker` objects on one event
  loop in a thread of this process (unit tests of dispatch, requeue and respawn; no Ray).

A worker whose start fails is reported as lost with ``init_failed`` and a one-line ``error``
(``Type: message`` of the exception its constructor raised).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from regen.engine.worker import SampleOutcome

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class Worker:
    """One worker in a slot of the pool and the work items it holds."""

    index: int  #: slot number (a replacement takes the dead one's slot)
    handle: Any  #: the pool's object (a Ray actor handle, a SampleWorker)
    slots: int  #: its in-flight limit (it reports changes with each outcome)
    load: int = 0  #: work items handed to it and not finished
    alive: bool = True
    name: str = ""


@dataclass(slots=True)
class Finished:
    """One finished work item: an outcome, or the worker that held it is gone."""

    ticket: Any
    outcome: SampleOutcome | None = None
    lost: bool = False  #: the worker died (every ticket it held is lost)
    init_failed: bool = False  #: ... because it could not start
    error: str = ""  #: one line: why it was lost


class WorkerPool(Protocol):
    """What the dispatch loop needs from a set of workers."""

    def start(self, index: int, generation: int) -> Worker:
        """Start a worker in slot ``index`` (its ``generation``-th start overall)."""

    def submit(self, worker: Worker, sample: Any) -> Any:
        """Hand ``sample`` to ``worker``; returns a ticket (hashable)."""

    def wait(self, tickets: list[Any], timeout_s: float) -> list[Finished]:
        """Tickets finished within ``timeout_s`` (at least one unless the time ran out)."""

    def snapshots(self, workers: list[Worker]) -> list[dict[str, Any]]:
        """The live workers' counters (SampleWorker.snapshot); missing ones are skipped."""

    def cancel(self, tickets: list[Any]) -> None:
        """Best effort: stop the work of ``tickets``."""

    def stop(self, worker: Worker) -> None:
        """Stop one worker (best effort; a lost one may be gone already)."""

    def close(self) -> None:
        """Stop every worker."""


def one_line_error(text: str) -> str:
    """The last non-empty line of an error text (a traceback's ``Type: message``)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:500] if lines else "unknown error"


class RayWorkerPool:
    """Workers as Ray actors (``SPREAD`` over the cluster, one CPU-less actor each).

    Worker ``i`` starts at its share of each server's batch slots (``max_running_requests``
    split over ``n_workers``, when the servers report it).
    """

    def __init__(
        self,
        session: str,
        manifest: Any,
        infos: list[Any],
        concurrency: int,
        n_workers: int,
        *,
        log_level: str = "INFO",
        secrets: dict[str, str] | None = None,
    ) -> None:
        from regen.engine.actor import MAX_CALLS_PER_ACTOR, actor_class

        self.session = session
        self.infos = infos
        self.concurrency = concurrency
        self.n_workers = n_workers
        self._cls = actor_class(MAX_CALLS_PER_ACTOR)
        self._args = (manifest, infos, concurrency, log_level, secrets or {})
        self.spawned: list[Any] = []

    def shares(self, index: int) -> dict[str, int]:
        """Worker ``index``'s starting share of each server's batch slots (when reported)."""
        from regen.engine.adaptive import split

        return {
            i.url: split(i.max_running_requests, self.n_workers, index)
            for i in self.infos
            if getattr(i, "max_running_requests", None)
        }

    def start(self, index: int, generation: int) -> Worker:
        from regen.engine.worker import starting_limits

        name = f"regen-{self.session}-w{index}-{generation}"
        shares = self.shares(index)
        actor = self._cls.options(scheduling_strategy="SPREAD", name=name).remote(
            *self._args, shares
        )
        self.spawned.append(actor)
        slots = sum(starting_limits(self.infos, self.concurrency, shares).values())
        return Worker(index, actor, slots, name=name)

    def submit(self, worker: Worker, sample: Any) -> Any:
        return worker.handle.process.remote(sample)

    def wait(self, tickets: list[Any], timeout_s: float) -> list[Finished]:
        import ray
        from ray.exceptions import RayActorError, TaskCancelledError

        ready, _ = ray.wait(tickets, num_returns=len(tickets), timeout=0)  # busy: one call
        if not ready:
            ready, _ = ray.wait(tickets, num_returns=1, timeout=timeout_s)
        out = []
        for ref in ready:
            try:
                out.append(Finished(ref, outcome=ray.get(ref)))
            except RayActorError as e:
                init = bool(getattr(e, "actor_init_failed", False))
                out.append(Finished(ref, lost=True, init_failed=init, error=one_line_error(str(e))))
                log.debug("worker lost: %s", e)  # the full Ray text (traceback) at DEBUG
            except TaskCancelledError as e:
                out.append(Finished(ref, lost=True, error=one_line_error(str(e))))
        return out

    def snapshots(self, workers: list[Worker]) -> list[dict[str, Any]]:
        import ray

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

    def cancel(self, tickets: list[Any]) -> None:
        import ray

        for ref in tickets:
            with contextlib.suppress(Exception):
                ray.cancel(ref)

    def stop(self, worker: Worker) -> None:
        import ray

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


class WorkerLostError(Exception):
    """The in-process stand-in for a dead actor (raised into its pending tickets)."""


@dataclass(slots=True, eq=False)
class _Local:
    worker: Any  #: SampleWorker
    futures: set[concurrent.futures.Future[Any]] = field(default_factory=set)


class LocalWorkerPool:
    """Workers as objects on one event loop in a thread of this process (no Ray).

    ``factory(index, generation)`` builds a worker (a :class:`SampleWorker`, or anything with
    ``async process(sample)``, ``snapshot()`` and ``async aclose()``); an exception it raises is
    a failed start. :meth:`kill` makes a worker die as an actor does: its tickets are lost.
    """

    def __init__(self, factory: Callable[[int, int], Any]) -> None:
        self.factory = factory
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="regen-local-pool", daemon=True
        )
        self._thread.start()
        self._workers: dict[int, Worker] = {}
        self._failed_start: dict[int, str] = {}

    def start(self, index: int, generation: int) -> Worker:
        w = Worker(index, None, 0, name=f"local-w{index}-{generation}")
        try:
            w.handle = _Local(self.factory(index, generation))
            slots = getattr(w.handle.worker, "slots", None)
            w.slots = slots.capacity if slots is not None else 1
        except Exception as e:  # a failed start: its first ticket reports it
            self._failed_start[id(w)] = f"{type(e).__name__}: {e}"
        self._workers[id(w)] = w
        return w

    def submit(self, worker: Worker, sample: Any) -> Any:
        fail = self._failed_start.get(id(worker))
        fut: concurrent.futures.Future[Any]
        if fail is not None or not worker.alive:
            fut = concurrent.futures.Future()
            fut.set_exception(WorkerLostError(fail or "worker is dead"))
        else:
            fut = asyncio.run_coroutine_threadsafe(worker.handle.worker.process(sample), self.loop)
            worker.handle.futures.add(fut)
        fut.regen_worker = worker  # type: ignore[attr-defined]
        return fut

    def kill(self, worker: Worker) -> None:
        """Make ``worker`` die: every ticket it holds is lost."""
        if worker.handle is None:
            return
        for fut in list(worker.handle.futures):
            fut.cancel()
        self._failed_start[id(worker)] = "killed"

    def wait(self, tickets: list[Any], timeout_s: float) -> list[Finished]:
        done, _ = concurrent.futures.wait(
            tickets, timeout=timeout_s, return_when=concurrent.futures.FIRST_COMPLETED
        )
        out = []
        for fut in done:
            w = fut.regen_worker
            if w.handle is not None:
                w.handle.futures.discard(fut)
            fail = self._failed_start.get(id(w))
            if fut.cancelled() or fail == "killed":
                out.append(Finished(fut, lost=True, error="killed"))
                continue
            e = fut.exception()
            if isinstance(e, WorkerLostError):
                out.append(Finished(fut, lost=True, init_failed=fail is not None, error=str(e)))
            elif e is not None:  # process() itself never raises; a bug kills the worker
                out.append(Finished(fut, lost=True, error=f"{type(e).__name__}: {e}"))
            else:
                out.append(Finished(fut, outcome=fut.result()))
        return out

    def snapshots(self, workers: list[Worker]) -> list[dict[str, Any]]:
        return [
            w.handle.worker.snapshot()
            for w in workers
            if w.alive and w.handle is not None and id(w) not in self._failed_start
        ]

    def cancel(self, tickets: list[Any]) -> None:
        for fut in tickets:
            fut.cancel()

    def stop(self, worker: Worker) -> None:
        self.kill(worker)

    def close(self) -> None:
        async def close_all() -> None:
            for w in self._workers.values():
                if w.handle is not None and hasattr(w.handle.worker, "aclose"):
                    with contextlib.suppress(Exception):
                        await w.handle.worker.aclose()

        if self.loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(close_all(), self.loop).result(timeout=5)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
