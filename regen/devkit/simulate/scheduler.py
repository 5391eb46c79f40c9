"""The capacity model: R batch slots advanced together by one step loop, as on a GPU.

Every ``step_s`` the single loop gives each running job ``tokens_per_step`` tokens (or what it
has left), so the server's capacity is ``R * K / step_s`` tok/s whatever the batch holds: an
under-filled batch wastes capacity. Jobs beyond R wait in a FIFO queue and join the batch at
the start of a step. If the event loop falls behind its schedule (a busy machine), the loop
catches up by running the missed steps at once (up to ``MAX_CATCHUP``), so the capacity
stays exact and only the chunking gets coarser.

A speculative server (``spec``, :class:`regen.devkit.simulate.speculative.SpecServer`) runs the same
loop with two changes: a step takes ``spec.step_s(step_s, batch)`` (the verify pass grows
with the batch), and a job's first step yields the prefill's one token while each later step
is a verify step that keeps ``job.spec.step(remaining)`` tokens (its acceptance length); the
verify steps go into ``spec``'s running counters (``avg_spec_accept_length``). Without
``spec`` the loop is the plain one, unchanged.

Prefill (``prefill_s_per_token`` > 0): a job enters the batch with ``job.prefill`` prompt
tokens to compute (its prompt less what the prefix cache held,
:mod:`regen.devkit.simulate.prefix_cache`). Each step first takes up to ``chunk`` of those
tokens, from the jobs in the order they were admitted (SGLang's chunked prefill: a long prompt
takes several steps, ``--chunked-prefill-size`` tokens each), and lasts ``step_s`` plus
``prefill_s_per_token`` per token taken; a job makes its first token in the step its prefill
ends (the prefill's own token) and decodes from then on.
The jobs still prefilling hold their slots. This is SGLang's mixed-chunk schedule (a chunk and
the decode batch in one forward); its default alternates a prefill forward and a decode
forward, which costs the same server time. At 0 (the default) prefill is free and the loop is
the one above, unchanged.

A request whose client closed its stream may go on for a while (``job.abort_at``, loop time):
SGLang aborts it ~2 s later (``create_abort_task``), vLLM at once. Until then it holds its slot
and generates tokens that count in ``tokens`` (nobody reads them).

:meth:`Scheduler.pause` stops the loop as a hung GPU does (a simulated hang,
:mod:`regen.devkit.simulate.outage`): no step, no admission, until :meth:`Scheduler.resume`; the
step in flight when it stopped ends when it resumes, and the missed time is not caught up. Owns no
files.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from dataclasses import dataclass, field

from regen.core.errors import ConfigError
from regen.devkit.simulate.speculative import SpecRequest, SpecServer

log = logging.getLogger(__name__)

#: most missed steps run at once when the loop lags
MAX_CATCHUP = 50


@dataclass(slots=True, eq=False)
class Job:
    """One request's generation: ``produced`` grows from 0 to ``total``."""

    total: int
    produced: int = 0
    prompt: int = 0  #: prompt tokens (what it holds of the KV pool besides its output)
    cancelled: bool = False
    waiter: asyncio.Future[None] | None = None
    admitted_at: float | None = None
    finished_at: float | None = None
    first_at: float | None = None  #: when its first token was made (loop time)
    spec: SpecRequest | None = None  #: its verify steps on a speculative server
    prefill: int = 0  #: prompt tokens still to prefill (0: decoding)
    cached: int = 0  #: prompt tokens the prefix cache held
    abort_at: float | None = None  #: loop time the engine aborts it (its stream was closed)

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
    busy_s: float = 0.0  #: simulated time of those steps (prefill included)
    prefill_tokens: int = 0  #: prompt tokens prefilled (not cached)
    prefill_s: float = 0.0  #: simulated time spent prefilling them
    since: float = field(default_factory=time.monotonic)


class Scheduler:
    """R slots, K tokens per slot per step, one step every ``step_s``."""

    def __init__(
        self,
        max_running: int,
        step_s: float,
        tokens_per_step: int,
        spec: SpecServer | None = None,
        *,
        prefill_s_per_token: float = 0.0,
        chunk: int = 8192,
    ) -> None:
        if max_running < 1 or step_s <= 0 or tokens_per_step < 1:
            raise ConfigError("need max_running >= 1, step_s > 0, tokens_per_step >= 1")
        if prefill_s_per_token < 0 or chunk < 1:
            raise ConfigError("need prefill_s_per_token >= 0 and chunk >= 1")
        self.prefill_s_per_token = prefill_s_per_token
        self.chunk = chunk
        self.max_running = max_running
        self.step_s = step_s
        self.tokens_per_step = tokens_per_step
        self.spec = spec
        self.queue: collections.deque[Job] = collections.deque()
        self.running: list[Job] = []
        self.counters = SchedulerCounters()
        #: tokens generated since start (never reset: what /metrics counts)
        self.tokens_total = 0
        self._wakeup: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        #: stopped by :meth:`pause` (a simulated hang)
        self.paused = False
        self._unpaused: asyncio.Future[None] | None = None
        self._output_waiters: list[asyncio.Future[None]] = []
        #: jobs whose closed stream is aborted later (``close``)
        self._closing = 0

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

    def pause(self) -> None:
        """Stop stepping (a hang): running jobs make no progress, queued ones are not admitted."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        w = self._unpaused
        if w is not None and not w.done():
            w.set_result(None)

    async def next_output(self) -> None:
        """Wait until a step makes tokens (any job's: what SGLang's health check waits for)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._output_waiters.append(waiter)
        await waiter

    def _output(self) -> None:
        waiters, self._output_waiters = self._output_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def _hold(self) -> bool:
        """Wait while paused; True when it waited."""
        if not self.paused:
            return False
        self._unpaused = asyncio.get_running_loop().create_future()
        try:
            await self._unpaused
        finally:
            self._unpaused = None
        return True

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_tick = loop.time()  # (not 0: a job submitted before the loop ran is not "late")
        k = self.tokens_per_step
        spec = self.spec
        while True:
            if not self.running and not self.queue:
                self._wakeup = loop.create_future()
                await self._wakeup
                self._wakeup = None
                next_tick = loop.time()
            if await self._hold():
                next_tick = loop.time()
            self._admit(loop.time())
            step_s = self.step_s if spec is None else spec.step_s(self.step_s, self.n_running)
            chunks = self._plan_prefill() if self.prefill_s_per_token else []
            prefill_s = sum(n for _, n in chunks) * self.prefill_s_per_token
            next_tick += step_s + prefill_s
            delay = next_tick - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if await self._hold():  # the step in flight ends with the hang, nothing caught up
                next_tick = loop.time()
            now = loop.time()
            if chunks:
                self._prefill(chunks, prefill_s)
            if self._closing:
                self._expire(now)
            steps = 1
            if now - next_tick >= step_s:  # lagging: run the missed steps now
                missed = int((now - next_tick) / step_s)
                steps += min(missed, MAX_CATCHUP - 1)
                next_tick += (steps - 1) * step_s
                if missed >= MAX_CATCHUP:
                    next_tick = now
            c = self.counters
            running = [j for j in self.running if not j.cancelled and not j.prefill]
            c.late_steps += steps - 1
            if spec is not None:
                held = [j for j in self.running if j.prefill and not j.cancelled]
                self.running = held + self._speculate(spec, running, steps, now)
                if running:
                    self._output()
                continue
            c.steps += steps
            c.slot_steps += steps * len(running)
            c.busy_s += steps * step_s
            grant = k * steps
            still = []
            for job in running:
                before = job.produced
                job.produced = min(job.total, before + grant)
                c.tokens += job.produced - before
                self.tokens_total += job.produced - before
                if before == 0:
                    job.first_at = now
                if job.produced >= job.total:
                    job.finished_at = now
                else:
                    still.append(job)
                job._wake()
            if chunks or len(running) != len(self.running):  # jobs still prefilling stay
                still = [j for j in self.running if j.prefill and not j.cancelled] + still
            self.running = still
            if running:
                self._output()

    def _plan_prefill(self) -> list[tuple[Job, int]]:
        """This step's chunk: up to ``chunk`` prompt tokens of the jobs still prefilling."""
        left = self.chunk
        out: list[tuple[Job, int]] = []
        for job in self.running:
            if job.prefill and not job.cancelled:
                n = min(job.prefill, left)
                out.append((job, n))
                left -= n
                if not left:
                    break
        return out

    def _prefill(self, chunks: list[tuple[Job, int]], prefill_s: float) -> None:
        c = self.counters
        for job, n in chunks:
            job.prefill -= n
            c.prefill_tokens += n
        c.prefill_s += prefill_s
        c.busy_s += prefill_s

    def close(self, job: Job, delay_s: float) -> None:
        """The client closed ``job``'s stream: abort it now, or after ``delay_s`` (SGLang)."""
        if delay_s <= 0 or job.done:
            job.cancelled = True
            return
        job.abort_at = asyncio.get_running_loop().time() + delay_s
        self._closing += 1

    def _expire(self, now: float) -> None:
        """Abort the jobs whose closed stream's delay is over."""
        pending = 0
        for job in self.running:
            if job.abort_at is not None and not job.cancelled and not job.done:
                if now >= job.abort_at:
                    job.cancelled = True
                else:
                    pending += 1
        self._closing = pending + sum(j.abort_at is not None and not j.cancelled
                                      for j in self.queue)  # fmt: skip

    def _speculate(self, spec: SpecServer, running: list[Job], steps: int, now: float) -> list[Job]:
        """Up to ``steps`` speculative steps of the batch (a catch-up ends early when every
        job is done, and each step is counted at its own batch); returns the jobs still
        running."""
        c = self.counters
        for _ in range(steps):
            batch = [j for j in running if j.produced < j.total]
            if not batch:
                break
            c.steps += 1
            c.slot_steps += len(batch)
            c.busy_s += spec.step_s(self.step_s, len(batch))
            kept = verified = 0
            for job in batch:
                before = job.produced
                if before == 0 or job.spec is None:  # the prefill's token (or a plain job)
                    n = 1
                else:
                    n = job.spec.step(job.total - before)
                    kept += n
                    verified += 1
                job.produced = before + n
                c.tokens += n
                self.tokens_total += n
                if before == 0:
                    job.first_at = now
            if verified:
                spec.record_step(kept, verified)
        still = []
        for job in running:
            if job.produced >= job.total:
                job.finished_at = now
            else:
                still.append(job)
            job._wake()
        return still

    def _admit(self, now: float) -> None:
        while self.queue and len(self.running) < self.max_running:
            job = self.queue.popleft()
            if job.abort_at is not None and now >= job.abort_at:
                job.cancelled = True
            if job.cancelled:
                continue
            job.admitted_at = now
            self.running.append(job)
