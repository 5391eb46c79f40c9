"""``EndpointRouter``: leases on endpoints for a worker's requests, and their outcomes.

It holds one :class:`~regen.engine.router.state.EndpointState` per endpoint and puts the parts
together: a request's lease goes to the sample's bound endpoint when it may take it
(:mod:`.affinity`), else to the one :mod:`.choice` picks; a released lease's outcome is counted
and handed to :mod:`.health` (failures, stalls, refusals) or :mod:`.cooling` (overloads).

- **In-flight limit** per endpoint: a knob (:meth:`EndpointRouter.set_limit`), started from the
  server's ``max_running_requests`` when it reports one (None: unlimited). Adaptive
  concurrency can move it later; the router only enforces it.
- **Waiting**: :meth:`EndpointRouter.acquire` waits until an endpoint has room for the sample
  (woken by a release, a recovery, the end of a cool-down or a due trial). When every endpoint
  is refused it raises :class:`~regen.core.errors.NoEndpointLeftError` naming each; the sample
  is not failed (the caller leaves it for the next run).
- **Retry elsewhere**: a sample whose request stalled, or was refused as overloaded, avoids
  that endpoint while another is up (:meth:`EndpointRouter.avoid`).

All asyncio, single event loop; the clock is injectable for tests. Owns no files on disk;
:meth:`EndpointRouter.snapshot` is a plain dict for the progress file.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from regen.core.errors import (
    EndpointError,
    NoEndpointLeftError,
    OverloadedError,
    PermanentError,
)
from regen.engine.router.affinity import Affinity
from regen.engine.router.choice import choose, excluded, trial_open
from regen.engine.router.cooling import cool_waits, overloaded
from regen.engine.router.health import Health
from regen.engine.router.probe import ProbeFn
from regen.engine.router.state import HALF_OPEN, REFUSED, UP, EndpointState, Lease


class EndpointRouter:
    """Chooses endpoints for requests; tracks in-flight counts, latency and health."""

    def __init__(
        self,
        endpoints: Sequence[Any],
        *,
        failure_threshold: int = 5,
        probe_interval_s: float = 15.0,
        probe: ProbeFn | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``endpoints``: URLs, :class:`regen.manifest.Endpoint` or
        :class:`regen.client.EndpointInfo` (weight and max_running_requests are read)."""
        if not endpoints:
            raise EndpointError("the router needs at least one endpoint")
        states = (EndpointState.of(e) for e in endpoints)
        self._eps: dict[str, EndpointState] = {s.url: s for s in states}
        self._clock = clock
        self._changed = asyncio.Event()
        self._health = Health(failure_threshold=failure_threshold,
                              probe_interval_s=probe_interval_s, probe=probe, clock=clock,
                              notify=self._notify)  # fmt: skip
        self._affinity = Affinity()

    # ---- knobs and views -------------------------------------------------------------------

    @property
    def failure_threshold(self) -> int:
        return self._health.failure_threshold

    @property
    def probe_interval_s(self) -> float:
        return self._health.probe_interval_s

    @property
    def urls(self) -> list[str]:
        return list(self._eps)

    def in_flight(self, url: str) -> int:
        return self._eps[url].in_flight

    def limit(self, url: str) -> int | None:
        return self._eps[url].limit

    def set_limit(self, url: str, limit: int | None) -> None:
        """Set the in-flight cap of one endpoint (None: unlimited)."""
        if limit is not None and limit < 1:
            raise ValueError("an in-flight limit must be >= 1 (or None)")
        self._eps[url].limit = limit
        self._notify()

    def set_server_load(self, url: str, load: Any) -> None:
        """The server's own reading (a :class:`regen.client.server_load.ServerLoad`; None: no
        fresh one): what it holds beyond this router's requests weighs in the choice."""
        self._eps[url].read_server(load)

    def others(self, url: str) -> float:
        """Requests the server holds besides this router's (its last reading; 0: none)."""
        return self._eps[url].others

    def state(self, url: str) -> str:
        self._health.refresh(self._eps[url], self._clock())
        return self._eps[url].state

    def affinity(self, sample_id: str) -> str | None:
        return self._affinity.bound(sample_id)

    def forget(self, sample_id: str) -> None:
        """Drop a finished sample's endpoint binding (and what it avoids)."""
        self._affinity.forget(sample_id)

    def avoid(self, sample_id: str, url: str) -> None:
        """This sample's next requests go to any other endpoint that is up (a request of it
        stalled on ``url``, or was refused as overloaded); to ``url`` only when no other is
        up."""
        self._affinity.avoid(sample_id, url)

    def refused(self) -> dict[str, str]:
        """The endpoints refused this session, each with why and what to fix."""
        return {u: s.refusal or "" for u, s in self._eps.items() if s.state == REFUSED}

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per-endpoint stats as a plain JSON-able dict (for the progress snapshot)."""
        now = self._clock()
        out: dict[str, dict[str, Any]] = {}
        for url, s in self._eps.items():
            self._health.refresh(s, now)
            out[url] = s.stats(now)
        return out

    # ---- leases -----------------------------------------------------------------------------

    def try_acquire(self, sample_id: str) -> Lease | None:
        """A lease on the endpoint for this sample's next request, or None if none has room.
        A sample bound to an endpoint up but full waits for it (its prefix cache is there)."""
        now = self._clock()
        for s in self._eps.values():
            self._health.refresh(s, now)
        skip = excluded(self._eps.values(), self._affinity.avoided(sample_id), now)
        bound = self._affinity.bound(sample_id)
        if bound is not None and bound not in skip:
            s = self._eps[bound]
            if s.state == UP:
                return self._lease(s, sample_id, now) if s.has_room() else None
            if trial_open(s):
                return self._lease(s, sample_id, now)
        chosen = choose(self._eps.values(), skip)
        if chosen is None:
            return None
        self._affinity.bind(sample_id, chosen.url)
        return self._lease(chosen, sample_id, now)

    async def acquire(self, sample_id: str) -> Lease:
        """Wait until an endpoint has room for this sample (wakes on release or recovery);
        raises :class:`NoEndpointLeftError` once every endpoint is refused."""
        while True:
            lease = self.try_acquire(sample_id)
            if lease is not None:
                return lease
            if all(s.state == REFUSED for s in self._eps.values()):
                raise NoEndpointLeftError(no_endpoint_message(self.refused()))
            changed = self._changed
            wait = self._next_change_in()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=wait)

    def release(
        self, lease: Lease, error: BaseException | None = None, *, latency_s: float | None = None
    ) -> None:
        """Give a lease back. ``error``: the exception the request ended with (None: success)."""
        s = self._eps[lease.url]
        now = self._clock()
        self._give_back(s, lease)
        s.record_latency(now - lease.started_at if latency_s is None else latency_s)
        if error is None or isinstance(error, PermanentError):
            s.ok += 1
            self._health.succeeded(s)
        elif isinstance(error, OverloadedError):
            s.throttled += 1
            s.last_error = type(error).__name__
            overloaded(s, now)
            self._health.overloaded(s)
        else:
            s.failures += 1
            s.last_error = f"{type(error).__name__}: {str(error)[:200]}"
            self._health.failed(s, error, now)
        self._notify()

    def abandon(self, lease: Lease) -> None:
        """Give a lease back without counting an outcome (the request was cancelled)."""
        self._give_back(self._eps[lease.url], lease)
        self._notify()

    @contextlib.asynccontextmanager
    async def lease(self, sample_id: str) -> AsyncIterator[Lease]:
        """``async with router.lease(sid) as l:`` acquire, then release with the outcome."""
        held = await self.acquire(sample_id)
        try:
            yield held
        except Exception as e:
            self.release(held, e)
            raise
        except BaseException:  # cancelled: give the slot back, count nothing
            self.abandon(held)
            raise
        else:
            self.release(held)

    def _lease(self, s: EndpointState, sample_id: str, now: float) -> Lease:
        trial = s.state == HALF_OPEN
        if trial:
            s.trial_in_flight = True
        s.in_flight += 1
        s.requests += 1
        return Lease(url=s.url, sample_id=sample_id, started_at=now, trial=trial)

    @staticmethod
    def _give_back(s: EndpointState, lease: Lease) -> None:
        s.in_flight -= 1
        if lease.trial:
            s.trial_in_flight = False

    # ---- health -----------------------------------------------------------------------------

    async def probe_once(self) -> list[str]:
        """Probe every endpoint out of rotation whose probe is due; return those back in."""
        return await self._health.probe_once(self._eps.values())

    async def run_probes(
        self,
        stop: asyncio.Event,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        tick_s: float | None = None,
    ) -> None:
        """Probe due endpoints until ``stop`` is set (run it as a background task)."""
        tick = tick_s if tick_s is not None else min(self.probe_interval_s, 1.0)
        while not stop.is_set():
            await self.probe_once()
            await sleep(tick)

    def stall(self, url: str, why: str) -> bool:
        """Take an endpoint out of rotation as ``stalled`` (its streams stopped: ``why``);
        a probe brings it back. False when it was not up (already out)."""
        return self._health.stall(self._eps[url], why)

    def _next_change_in(self) -> float | None:
        """Seconds until an endpoint may take requests again without a release: a cool-down
        ends, a half-open trial is due, or (with a probe task) a probe may have passed."""
        now = self._clock()
        waits = cool_waits(self._eps.values(), now) + self._health.trial_waits(
            self._eps.values(), now
        )
        return max(0.01, min(waits)) if waits else None

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


def no_endpoint_message(refused: dict[str, str]) -> str:
    """What :class:`NoEndpointLeftError` says: each endpoint, why, what to fix, and that a
    rerun continues."""
    lines = "; ".join(f"{url}: {why}" for url, why in refused.items())
    return (f"no endpoint left: every endpoint refused requests ({lines}). Nothing is lost: "
            "fix the endpoint and run the same command again to continue")  # fmt: skip
