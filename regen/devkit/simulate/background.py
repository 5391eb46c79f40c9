"""A second client of the simulated server: the other users of a shared production server.

``background_requests`` requests are kept in the server at all times: each is submitted to the
scheduler as a job of ``background_max_tokens`` output tokens (``background_prompt_tokens`` of
prompt), waits in the same FIFO queue as the HTTP requests, holds a batch slot while it runs,
and is submitted again as soon as it ends (a closed loop, as a client with that concurrency
behaves). They skip HTTP, so they cost the machine almost nothing, but they count everywhere a
real server counts another client's requests: the queue-full limit, ``/metrics`` (running,
queued, KV usage, tokens, latencies) and ``/stats`` (``background``: completed, tokens).
Owns no files.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from regen.devkit.simulate.metrics_page import SimMetrics
from regen.devkit.simulate.scheduler import Job, Scheduler


@dataclass(slots=True)
class BackgroundCounters:
    completed: int = 0  #: background requests answered in full
    tokens: int = 0  #: their output tokens


class BackgroundClient:
    """Keeps ``requests`` jobs of another client in ``scheduler`` until stopped."""

    def __init__(
        self,
        scheduler: Scheduler,
        metrics: SimMetrics | None,
        *,
        requests: int,
        max_tokens: int,
        prompt_tokens: int,
    ) -> None:
        self.scheduler, self.metrics = scheduler, metrics
        self.requests, self.max_tokens, self.prompt_tokens = requests, max_tokens, prompt_tokens
        self.counters = BackgroundCounters()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._client(), name=f"sim-background-{i}")
                       for i in range(self.requests)]  # fmt: skip

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    async def _client(self) -> None:
        """One request after another, for ever."""
        while True:
            received = time.monotonic()
            job = Job(total=self.max_tokens, prompt=self.prompt_tokens)
            if self.metrics is not None:
                self.metrics.admitted(self.prompt_tokens)
            self.scheduler.submit(job)
            try:
                while not job.done:
                    await job.progress()
            except asyncio.CancelledError:
                job.cancelled = True
                raise
            self.counters.completed += 1
            self.counters.tokens += job.total
            if self.metrics is not None:
                self.metrics.finished(stream=True, prompt_tokens=self.prompt_tokens,
                                      completion_tokens=job.total, finish_reason="length",
                                      received_at=received, first_token_at=job.first_at,
                                      finished_at=time.monotonic())  # fmt: skip
