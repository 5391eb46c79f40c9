"""Health: what takes an endpoint out of rotation, and what brings it back.

- **Failures**: ``failure_threshold`` consecutive transient failures (connection refused,
  timeouts, cut streams, 5xx other than 503) take an endpoint out of rotation ("down"). It
  comes back either by a probe (:meth:`Health.probe_once`, every ``probe_interval_s``;
  regen.engine.router.probe) or, when no probe function is given, by a half-open trial: once
  the interval has passed, one real request is let through; success restores it, failure
  sends it down for another interval.
- **Overloads** are not sickness (regen.engine.router.cooling): after ``failure_threshold``
  overloads in a row with no success, the probe is asked once in the background
  (:meth:`Health.check`); only when it fails too does the endpoint leave rotation. A permanent
  error is not a health failure either (the server answered).
- **Stalls**: a :class:`~regen.core.errors.StallError` (a stream that sent nothing for the
  stall timeout, regen.engine.stall) is counted as a stall; ``STALL_STREAK`` stalls in a row
  with no success between, or the stall watch's word that the whole server stopped
  (:meth:`Health.stall`), take it out of rotation as ``stalled`` (one warning). It comes back
  by a probe, as a down endpoint does (``/health_generate`` generates a token: a hung scheduler
  fails it).
- **Refusals**: an :class:`~regen.core.errors.EndpointFaultError` (401, 403, 404, 405, 407, an
  answer that is not the protocol) takes the endpoint out of rotation at once and for the rest
  of the session ("refused": no probe brings it back, since a gateway that refuses chat
  requests may well pass health checks; a rerun tries it again), with one warning naming the
  endpoint, the status, the body's start and what to fix.

Owns no files.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

from regen.core.errors import EndpointFaultError, StallError
from regen.engine.router.cooling import calm
from regen.engine.router.probe import ProbeFn
from regen.engine.router.state import DOWN, HALF_OPEN, PROBED, REFUSED, STALLED, UP, EndpointState

log = logging.getLogger(__name__)

#: stalls in a row (no success between) that take an endpoint out of rotation
STALL_STREAK = 2


class Health:
    """Moves endpoints in and out of rotation; ``notify`` is called when one may take
    requests again or left rotation outside a request's release."""

    def __init__(
        self,
        *,
        failure_threshold: int,
        probe_interval_s: float,
        probe: ProbeFn | None,
        clock: Callable[[], float],
        notify: Callable[[], None],
    ) -> None:
        self.failure_threshold = failure_threshold
        self.probe_interval_s = probe_interval_s
        self._probe = probe
        self._clock = clock
        self._notify = notify
        self._checks: set[asyncio.Task[None]] = set()

    # ---- a request's outcome ----------------------------------------------------------------

    def succeeded(self, s: EndpointState) -> None:
        """The endpoint answered: its streaks end, and it is back in rotation (unless
        refused: a request sent before the refusal does not bring it back)."""
        s.consecutive_failures = 0
        calm(s)
        s.consecutive_stalls = 0
        if s.state == REFUSED:
            return
        if s.state != UP:
            log.info("endpoint %s back in rotation", s.url)
            s.state = UP
            s.down_since = None
            s.next_probe_at = None

    def failed(self, s: EndpointState, error: BaseException, now: float) -> None:
        """A request failed with ``error`` (counted already): a refusal, a stall or a failure."""
        if isinstance(error, EndpointFaultError):
            self._refuse(s, error)
        elif isinstance(error, StallError):
            s.stalls += 1
            s.consecutive_stalls += 1
            if s.state == HALF_OPEN:
                self._failure(s, now)
            elif s.consecutive_stalls >= STALL_STREAK:
                self.stall(s, f"{s.consecutive_stalls} streams in a row stalled")
        else:
            self._failure(s, now)

    def overloaded(self, s: EndpointState) -> None:
        """An overload answer (cooled already): after a streak, ask the probe."""
        if s.consecutive_overloads >= self.failure_threshold:
            self.check(s)

    def _failure(self, s: EndpointState, now: float) -> None:
        s.consecutive_failures += 1
        if s.state == HALF_OPEN:
            s.state = DOWN
            s.next_probe_at = now + self.probe_interval_s
            log.warning("endpoint %s failed its trial request; still out of rotation", s.url)
        elif s.state == UP and s.consecutive_failures >= self.failure_threshold:
            self._out(s, DOWN, now)
            log.warning(
                "endpoint %s out of rotation after %d consecutive failures (last: %s)",
                s.url,
                s.consecutive_failures,
                s.last_error,
            )

    def _refuse(self, s: EndpointState, error: EndpointFaultError) -> None:
        if s.state == REFUSED:
            return
        s.state = REFUSED
        s.down_since = self._clock()
        s.next_probe_at = None
        s.refusal = f"{error}; fix: {error.fix}" if error.fix else str(error)
        log.warning("endpoint %s out of rotation for this session: %s", s.url, s.refusal)

    def stall(self, s: EndpointState, why: str) -> bool:
        """Take an endpoint out of rotation as ``stalled`` (its streams stopped: ``why``);
        a probe brings it back. False when it was not up (already out)."""
        if s.state not in (UP, HALF_OPEN):
            return False
        self._out(s, STALLED, self._clock())
        s.last_error = s.stall_reason = f"stalled: {why}"
        log.warning("endpoint %s stalled: %s; out of rotation, probed every %g s",
                    s.url, why, self.probe_interval_s)  # fmt: skip
        self._notify()
        return True

    def _out(self, s: EndpointState, state: str, now: float) -> None:
        """Out of rotation as ``state`` (down or stalled), probed after the interval."""
        s.state = state
        s.down_since = now
        s.next_probe_at = now + self.probe_interval_s

    # ---- probes and trials ------------------------------------------------------------------

    def refresh(self, s: EndpointState, now: float) -> None:
        """Without a probe function: an endpoint out of rotation whose interval has passed is
        half open (one trial request may pass)."""
        if (
            s.state in PROBED
            and self._probe is None
            and s.next_probe_at is not None
            and now >= s.next_probe_at
        ):
            s.state = HALF_OPEN

    def check(self, s: EndpointState) -> None:
        """After an overload streak, ask the probe once (in the background) whether the endpoint
        is busy or sick; only a failed probe takes it out of rotation."""
        if self._probe is None or s.checking or s.state != UP:
            return
        s.checking = True
        task = asyncio.get_running_loop().create_task(self._health_check(s))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _health_check(self, s: EndpointState) -> None:
        try:
            if await self._answers(s.url):
                s.consecutive_overloads = 0  # busy, not sick
                return
            if s.state == UP:
                self._out(s, DOWN, self._clock())
                log.warning(
                    "endpoint %s out of rotation: %d overload answers in a row and its health "
                    "probe failed",
                    s.url,
                    s.consecutive_overloads,
                )
                self._notify()
        finally:
            s.checking = False

    async def _answers(self, url: str) -> bool:
        """The probe's word on ``url`` (a probe that raises: no)."""
        assert self._probe is not None
        try:
            return await self._probe(url)
        except Exception:  # a probe that cannot ask: the endpoint did not answer
            return False

    async def probe_once(self, states: Collection[EndpointState]) -> list[str]:
        """Probe every endpoint out of rotation whose probe is due; return those back in."""
        if self._probe is None:
            return []
        now = self._clock()
        due = [
            s
            for s in states
            if s.state in PROBED and s.next_probe_at is not None and now >= s.next_probe_at
        ]
        back: list[str] = []
        for s in due:
            if await self._answers(s.url):
                self.succeeded(s)
                back.append(s.url)
            else:
                s.next_probe_at = self._clock() + self.probe_interval_s
        if back:
            self._notify()
        return back

    def trial_waits(self, states: Collection[EndpointState], now: float) -> list[float]:
        """Seconds until an endpoint out of rotation may be back: with a probe function, one
        interval (a probe may have passed by then); without, until each half-open trial is
        due."""
        if self._probe is not None:
            return [self.probe_interval_s]
        return [s.next_probe_at - now for s in states
                if s.state in PROBED and s.next_probe_at is not None]  # fmt: skip
