"""A worker pool without Ray, for the dispatch loop's tests: :class:`LocalWorkerPool`.

It implements :class:`regen.engine.pool.WorkerPool` with worker objects (real
:class:`~regen.engine.worker.SampleWorker` s, or scripted ones) on one event loop in a thread
of the test process, each behind the same :class:`regen.engine.wire.Mailbox` an actor uses;
:meth:`LocalWorkerPool.kill` makes a worker die as an actor does (what it holds is lost).
Checked against :class:`regen.engine.pool.RayWorkerPool`: the same Mailbox calls, the same
replies through :class:`regen.engine.pool.Replies`, a failed start reported as a lost worker
with ``init_failed`` on its first exchange.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from regen.engine.pool import EXCHANGE_WAIT_S, Finished, Replies, Worker
from regen.engine.wire import LINGER_S, Mailbox, Reply


class LocalWorkerPool:
    """Workers as objects on one event loop in a thread of this process (no Ray).

    ``factory(index, generation)`` builds a worker (a :class:`SampleWorker`, or anything with
    ``async process(sample)``, ``snapshot()`` and ``async aclose()``); an exception it raises is
    a failed start. :meth:`kill` makes a worker die as an actor does: what it holds is lost.
    ``to_table``: how the workers convert rows, as actors do (default ``pa.Table.from_pylist``,
    which takes the scripted workers' rows of any shape; real rows:
    ``regen.store.schema.rows_to_table``).
    """

    def __init__(
        self,
        factory: Callable[[int, int], Any],
        *,
        to_table: Callable[[list[dict[str, Any]]], Any] = pa.Table.from_pylist,
        linger_s: float = LINGER_S,
    ) -> None:
        self.factory = factory
        self.to_table = to_table
        self.linger_s = linger_s
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="regen-local-pool", daemon=True
        )
        self._thread.start()
        self._boxes: dict[Worker, Mailbox] = {}
        self._gone: dict[Worker, tuple[str, bool]] = {}  #: (error, init_failed)
        self._r = Replies()

    def start(self, index: int, generation: int) -> Worker:
        w = Worker(index, None, 0, name=f"local-w{index}-{generation}")
        try:
            w.handle = self.factory(index, generation)
            slots = getattr(w.handle, "slots", None)
            w.slots = slots.capacity if slots is not None else 1
            self._boxes[w] = Mailbox(w.handle, to_table=self.to_table, linger_s=self.linger_s)
        except Exception as e:  # a failed start: its first exchange reports it
            self._gone[w] = (f"{type(e).__name__}: {e}", True)
        return w

    def pending(self, worker: Worker) -> bool:
        return worker in self._r.inflight

    def exchange(self, worker: Worker, samples: list[Any], low_water: int) -> None:
        fut: concurrent.futures.Future[Reply] = concurrent.futures.Future()
        box = self._boxes.get(worker)
        if worker in self._gone or box is None:
            fut.cancel()  # reported as lost by wait
            fut.set_running_or_notify_cancel()
        else:
            coro = box.exchange(list(samples), EXCHANGE_WAIT_S, low_water)
            fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        self._r.inflight[worker] = fut

    def kill(self, worker: Worker) -> None:
        """Make ``worker`` die: every sample it holds is lost."""
        self._gone.setdefault(worker, ("killed", False))
        box = self._boxes.get(worker)
        if box is not None:
            self.loop.call_soon_threadsafe(box.cancel_all)
        fut = self._r.inflight.get(worker)
        if fut is not None:
            fut.cancel()

    def wait(self, timeout_s: float) -> list[Finished]:
        futs = {f: w for w, f in self._r.inflight.items()}
        if not futs:
            return []
        done, _ = concurrent.futures.wait(
            futs, timeout=timeout_s, return_when=concurrent.futures.FIRST_COMPLETED
        )
        out = []
        for fut in done:
            w = futs[fut]
            self._r.inflight.pop(w, None)
            gone = self._gone.get(w)
            if gone is not None or fut.cancelled():
                error, init = gone if gone is not None else ("killed", False)
                out.append(Finished(w, lost=True, init_failed=init, error=error))
                continue
            e = fut.exception()
            if e is not None:  # exchange itself never raises; a bug kills the worker
                out.append(Finished(w, lost=True, error=f"{type(e).__name__}: {e}"))
            else:
                out.append(self._r.finished(w, fut.result()))
        return out

    def snapshots(self, workers: list[Worker], *, fresh: bool = False) -> list[dict[str, Any]]:
        if not fresh:
            return self._r.latest(workers)
        return [
            w.handle.snapshot()
            for w in workers
            if w.alive and w.handle is not None and w not in self._gone
        ]

    def cancel(self, workers: list[Worker]) -> None:
        for w in workers:
            box = self._boxes.get(w)
            if box is not None:
                self.loop.call_soon_threadsafe(box.cancel_all)

    def stop(self, worker: Worker) -> None:
        self.kill(worker)
        self._r.forget(worker)

    def close(self) -> None:
        async def close_all() -> None:
            for w, box in self._boxes.items():
                box.cancel_all()
                if hasattr(w.handle, "aclose"):
                    with contextlib.suppress(Exception):
                        await w.handle.aclose()

        if self.loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(close_all(), self.loop).result(timeout=5)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
        if not self.loop.is_running() and not self.loop.is_closed():
            self.loop.close()  # its selector and self-pipe
