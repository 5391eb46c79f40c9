"""The capacity model: R batch slots advanced together by one step loop, as on a GPU.

Every ``step_s`` the single loop gives each running job ``tokens_per_step`` tokens (or what it
has left), so the server's capacity is ``R * K / step_s`` tok/s whatever the batch holds: an
under-filled batch wastes capacity. Jobs beyond R wait in a FIFO queue and join the batch at
the start of a step. If the event loop falls behind its schedule (a busy machine), the loop
catches up by running the missed steps at once (up to ``MAX_CATCHUP``), so the capacity
stays exact and only the chunking gets coarser. Owns no files.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from dataclasses import dataclass, field

from regen.errors import ConfigError

log = logging.getLogger(__name__)

#: most missed steps run at once when the loop lags
MAX_CATCHUP = 50


@dataclass(slots=True, eq=False)
class Job:
    """One request's generation: ``produced`` grows from 0 to ``total``."""

    total: int
    produced: int = 0
    cancelled: bool = False
    waiter: asyncio.Future[None] | None = None
    admitted_at: float | None = None
    finished_at: float | None = None

    @property
    def done(self) -> bool:
        return self.produced >= self.total

    async def progress(self) -> None:
        """Wait until the scheduler advances (or finishes) this job."""
        if self.done:
            return
        if self.waiter is None or self.waiter.done():
            self.waiter = asyncio.get_running_loop().create_future()
        await self.waiter

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


@dataclass(slots=True)
class SchedulerCounters:
    steps: int = 0  #: steps that ran with at least one job
    slot_steps: int = 0  #: sum over steps of running jobs (occupancy numerator)
    tokens: int = 0  #: tokens generated (cancelled jobs included)
    late_steps: int = 0  #: steps run late, in a catch-up (the event loop lagged)
    since: float = field(default_factory=time.monotonic)


class Scheduler:
    """R slots, K tokens per slot per step, one step every ``step_s``."""

    def __init__(self, max_running: int, step_s: float, tokens_per_step: int) -> None:
        if max_running < 1 or step_s <= 0 or tokens_per_step < 1:
            raise ConfigError("need max_running >= 1, step_s > 0, tokens_per_step >= 1")
        self.max_running = max_running
        self.step_s = step_s
        self.tokens_per_step = tokens_per_step
        self.queue: collections.deque[Job] = collections.deque()
        self.running: list[Job] = []
        self.counters = SchedulerCounters()
        self._wakeup: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def capacity_tok_s(self) -> float:
        return self.max_running * self.tokens_per_step / self.step_s

    @property
    def n_running(self) -> int:
        """Jobs in the batch (aborted ones leave at the next step and are not counted)."""
        return sum(not j.cancelled for j in self.running)

    @property
    def n_queued(self) -> int:
        return sum(not j.cancelled for j in self.queue)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="sim-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, job: Job) -> Job:
        if job.total <= 0:
            job.produced = job.total
            return job
        self.queue.append(job)
        w = self._wakeup
        if w is not None and not w.done():
            w.set_result(None)
        return job

    def reset_counters(self) -> None:
        self.counters = SchedulerCounters()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_tick = 0.0
        k = self.tokens_per_step
        while True:
            if not self.running and not self.queue:
                self._wakeup = loop.create_future()
                await self._wakeup
                self._wakeup = None
                next_tick = loop.time()
            self._admit(loop.time())
            next_tick += self.step_s
            delay = next_tick - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            now = loop.time()
            steps = 1
            if now - next_tick >= self.step_s:  # lagging: run the missed steps now
                missed = int((now - next_tick) / self.step_s)
                steps += min(missed, MAX_CATCHUP - 1)
                next_tick += (steps - 1) * self.step_s
                if missed >= MAX_CATCHUP:
                    next_tick = now
            c = self.counters
            running = [j for j in self.running if not j.cancelled]
            c.steps += steps
            c.late_steps += steps - 1
            c.slot_steps += steps * len(running)
            grant = k * steps
            still = []
            for job in running:
                before = job.produced
                job.produced = min(job.total, before + grant)
                c.tokens += job.produced - before
                if job.produced >= job.total:
                    job.finished_at = now
                else:
                    still.append(job)
                job._wake()
            self.running = still

    def _admit(self, now: float) -> None:
        while self.queue and len(self.running) < self.max_running:
            job = self.queue.popleft()
            if job.cancelled:
                continue
            job.admitted_at = now
            self.running.append(job)
