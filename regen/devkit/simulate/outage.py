"""Server-wide outages on a schedule: a hang (the scheduler stops) and a 503 storm.

A **hang** is what a GPU hang or a stuck collective looks like on a real SGLang 0.5.23
server: the scheduler process stops while its HTTP server (the tokenizer manager) lives on.
:class:`Hang` starts one ``hang_at_s`` seconds after the server began serving or when the
``hang_after``-th chat request arrives (each trigger fires once), and ends it ``hang_for_s``
seconds later (None: never). While hung the scheduler takes no step (:meth:`Scheduler.pause`),
the server writes no byte of any answer and holds every new request before the scheduler
(:meth:`Hang.wait_resumed`), and the scheduler's ``/metrics`` gauges keep the values they had
when it stopped (:meth:`SimMetrics.freeze`: SGLang's scheduler process writes them, and a stuck
one writes nothing). When the hang ends everything carries on where it stopped.

An **overload window** (:class:`OverloadWindow`) is ``overload_for_s`` seconds, from
``overload_at_s`` after the server began serving or from the ``overload_after``-th chat
request, in which every new chat request is refused as ``Fault.OVERLOAD`` refuses it
(SGLang's full-queue 503).

Both are timed from :meth:`Hang.serving` / :meth:`OverloadWindow.serving`, called once the
server listens. Owns no files.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from regen.devkit.simulate.metrics_page import SimMetrics
from regen.devkit.simulate.scheduler import Scheduler

log = logging.getLogger(__name__)


class _Scheduled:
    """When an outage starts: ``at_s`` seconds after the server began serving (armed by
    :meth:`serving`), and when the ``after``-th chat request arrives (:meth:`request`); each
    trigger calls :meth:`start` once. Its timers are cancelled by :meth:`close`."""

    def __init__(self, at_s: float | None, after: int | None) -> None:
        self.at_s, self.after = at_s, after
        self.received = 0  #: chat requests received (what ``after`` counts)
        self._timers: list[asyncio.TimerHandle] = []

    def start(self, why: str) -> None:
        raise NotImplementedError

    def serving(self) -> None:
        """The server listens: arm ``at_s``."""
        if self.at_s is not None:
            self._later(self.at_s, self.start, f"at {self.at_s:g} s")

    def request(self) -> None:
        """A chat request arrived: the ``after``-th starts the outage (it meets it too)."""
        self.received += 1
        if self.after is not None and self.received == self.after:
            self.start(f"after {self.after} requests")

    def _later(self, delay: float, fn: Callable[..., object], *args: object) -> None:
        self._timers.append(asyncio.get_running_loop().call_later(delay, fn, *args))

    def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers = []


class Hang(_Scheduled):
    """The hang of one server: its triggers, its state, and the wait for its end."""

    def __init__(
        self,
        scheduler: Scheduler | None,
        metrics: SimMetrics | None,
        *,
        at_s: float | None = None,
        after: int | None = None,
        for_s: float | None = None,
    ) -> None:
        super().__init__(at_s, after)
        self.scheduler, self.metrics, self.for_s = scheduler, metrics, for_s
        self.hung = False
        self.count = 0  #: hangs started so far
        self.started_at: float | None = None  #: monotonic start of the current/last hang
        self._resumed = asyncio.Event()
        self._resumed.set()

    def start(self, why: str = "") -> None:
        if self.hung:
            return
        self.hung = True
        self.count += 1
        self.started_at = time.monotonic()
        self._resumed.clear()
        if self.scheduler is not None:
            self.scheduler.pause()
        if self.metrics is not None:
            self.metrics.freeze()
        until = f"for {self.for_s:g} s" if self.for_s is not None else "until stopped"
        log.warning("simulated hang %d: the scheduler stops (%s), %s", self.count, why, until)
        if self.for_s is not None:
            self._later(self.for_s, self.end)

    def end(self) -> None:
        if not self.hung:
            return
        self.hung = False
        if self.scheduler is not None:
            self.scheduler.resume()
        if self.metrics is not None:
            self.metrics.thaw()
        self._resumed.set()
        took = time.monotonic() - (self.started_at or time.monotonic())
        log.warning("simulated hang %d ends after %.3f s: the scheduler carries on", self.count,
                    took)  # fmt: skip

    async def wait_resumed(self, timeout: float | None = None) -> bool:
        """Return once the server is not hung (True), or False after ``timeout`` seconds."""
        if not self.hung:
            return True
        try:
            await asyncio.wait_for(self._resumed.wait(), timeout)
        except TimeoutError:
            return False
        return True


class OverloadWindow(_Scheduled):
    """``for_s`` seconds of SGLang's full-queue 503: from ``at_s`` after the server began
    serving, or from the arrival of the ``after``-th chat request (each trigger fires once)."""

    def __init__(self, at_s: float | None, for_s: float, after: int | None = None) -> None:
        super().__init__(at_s, after)
        self.for_s = for_s
        self.started_at: float | None = None  #: monotonic start of the storm

    def start(self, why: str) -> None:
        if self.started_at is not None:
            return
        self.started_at = time.monotonic()
        log.warning("simulated overload (%s): every new request gets SGLang's 503 for %g s",
                    why, self.for_s)  # fmt: skip
        self._later(self.for_s, log.warning, "simulated overload ends")

    def active(self) -> bool:
        if self.started_at is None:
            return False
        return time.monotonic() - self.started_at < self.for_s
