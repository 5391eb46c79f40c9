"""The Ray actor around :class:`regen.engine.worker.SampleWorker`. Owns no files.

An async actor: ``exchange`` starts a batch of samples on its event loop and returns the
outcomes finished since its last reply, packed for storing, with its counters now and then
(:mod:`regen.engine.wire`), so the driver pays one Ray call per batch instead of one per
sample and per progress tick.

The actor answers before its tokenizer is loaded: the row builder (chat template, tokenizer)
loads in a thread while the first requests are already out (rows are built only after an
answer). Should it fail to load, every later ``collect`` says so as a failed start (the driver
takes back what the actor held and treats it like an actor whose constructor raised).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

from regen.core.errors import TemplateError
from regen.core.sample import Sample
from regen.engine.inputs import RowSettings, WorkerConfig
from regen.engine.turns import DoneTurn
from regen.engine.wire import Mailbox, WireReply
from regen.engine.worker import Row, RowBuilder, SampleWorker, WorkerSnapshot, default_row_builder
from regen.plan.packed import QueueItem

log = logging.getLogger(__name__)


def quiet_http_logs() -> None:
    """One INFO line per HTTP request would drown everything else."""
    for name in ("httpx", "httpx2", "httpcore", "openai"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))


class LazyRows:
    """A row builder loaded in a thread; calls wait for it. ``error`` says why it failed."""

    def __init__(self, settings: RowSettings) -> None:
        self._built: RowBuilder | None = None
        self.error = ""
        self._ready = threading.Event()
        self._waiter: asyncio.Future[bool] | None = None
        threading.Thread(target=self._load, args=(settings,),
                         name="regen-rows-load", daemon=True).start()  # fmt: skip

    def _load(self, settings: RowSettings) -> None:
        try:
            self._built = default_row_builder(settings)
        except Exception as e:  # any failure to start is reported as a failed start
            self.error = f"{type(e).__name__}: {e}"
            log.error("the row builder could not start: %s", self.error)
        finally:
            self._ready.set()

    def problem(self) -> str:
        return self.error

    async def ready(self) -> None:
        """Wait until the builder is loaded (or failed to load), without blocking the loop."""
        if self._ready.is_set():
            return
        if self._waiter is None:
            self._waiter = asyncio.get_running_loop().run_in_executor(None, self._ready.wait)
        await asyncio.shield(self._waiter)

    def __call__(self, sample: Sample, turns: list[DoneTurn]) -> list[Row]:
        self._ready.wait()
        if self._built is None:
            raise TemplateError(f"the row builder could not start: {self.error}")
        return self._built(sample, turns)


class WorkerActor:
    """Ray actor body: one SampleWorker with its clients and router, behind a Mailbox."""

    def __init__(
        self,
        config: WorkerConfig,
        shares: dict[str, int] | None = None,
        *,
        log_level: str = "INFO",
        secrets: dict[str, str] | None = None,
    ) -> None:
        """``config``: what the worker runs with (the driver's one cut of the manifest; its
        row settings say how the renderer loads: the target tokenizer's class as the driver's
        check resolved it, :func:`regen.template.tokenizer.class_spec`, loaded without
        AutoTokenizer's model config, hence without torch); ``shares``: its starting share of
        each server's batch slots; ``secrets``: API keys by env var name (never logged)."""
        logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
        quiet_http_logs()
        for name, value in (secrets or {}).items():  # API keys by env var name; never logged
            os.environ.setdefault(name, value)
        self.rows = rows = LazyRows(config.rows)
        self.worker = SampleWorker(config, shares=shares, row_builder=rows)
        self.mailbox = Mailbox(self.worker, problem=rows.problem)

    async def exchange(
        self, samples: list[QueueItem], wait_s: float, low_water: int = -1, hold: bool = False
    ) -> WireReply:
        """:meth:`Mailbox.exchange`, as :meth:`regen.engine.wire.Reply.wire` data. ``hold``:
        start the samples only once the row builder is loaded
        (:attr:`regen.engine.pool.RayWorkerPool.hold_for_rows`)."""
        if hold and samples:
            await self.rows.ready()
        return (await self.mailbox.exchange(samples, wait_s, low_water)).wire()

    async def cancel(self) -> None:
        self.mailbox.cancel_all()

    async def snapshot(self) -> WorkerSnapshot:
        return self.worker.snapshot()

    async def close(self) -> None:
        self.mailbox.cancel_all()
        await self.worker.aclose()


def actor_class() -> Any:
    """The Ray remote class (a few concurrent calls: one exchange, a snapshot, cancel, close)."""
    import ray

    # Ray's stubs know no max_concurrency (an actor's option: ray.remote's documentation)
    return ray.remote(num_cpus=0, max_concurrency=MAX_CALLS_PER_ACTOR,  # type: ignore[call-overload]
                      max_restarts=0)(WorkerActor)  # fmt: skip


#: concurrent calls an actor accepts (the pending exchange, snapshots, cancel, close)
MAX_CALLS_PER_ACTOR = 64
