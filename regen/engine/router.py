"""``EndpointRouter``: which endpoint gets the next request.

- **Least loaded, weighted**: among endpoints in rotation with room, the one with the
  lowest ``(in_flight + others + 1) / weight`` (ties: manifest order). ``others`` is what the
  server holds besides this router's requests: its last ``/metrics`` reading of running plus
  queued requests (every client's, :meth:`EndpointRouter.set_server_load`) less this
  router's in flight at that reading; 0 without a fresh reading (then it is least
  outstanding, as regen's own count is all it knows).
- **Affinity**: all turns of one sample go to the endpoint that served its first turn (prefix
  cache), unless that endpoint left rotation; then the sample is rebound. ``forget(sample_id)``
  drops the binding when the sample is done (memory stays bounded by samples in flight).
- **In-flight limit** per endpoint: a knob (``set_limit``), started from the server's
  ``max_running_requests`` when it reports one (None: unlimited). Adaptive concurrency can
  move it later; the router only enforces it.
- **Health**: ``endpoint_failure_threshold`` consecutive transient failures (connection
  refused, timeouts, cut streams, 5xx other than 503) take an endpoint out of rotation
  ("down"). It comes back either by a probe (``probe_once`` / ``run_probes``, every
  ``endpoint_probe_interval_s``; the default :func:`http_probe` asks SGLang's
  ``/health_generate``, which generates a token, not ``/health``, which does not) or, when no
  probe function is given, by a half-open trial: once the interval has passed, one real
  request is let through; success restores it, failure sends it down for another interval.
- **Overload is not sickness**: an :class:`~regen.core.errors.OverloadedError` (SGLang's 503 for a
  full queue, a timeout abort or a retraction; a gateway's 429) is counted as ``throttled``
  and never takes an endpoint out of rotation by itself (adaptive concurrency backs off
  instead). It does cool the endpoint: for ``OVERLOAD_COOL_S``, doubled with each overload in
  a row up to ``OVERLOAD_COOL_MAX_S``, it gets no new request while another endpoint is up,
  and a sample bound to it goes elsewhere. Without that, a server refusing everything at once
  holds the fewest requests and so draws every new one (least loaded): a 503 storm on one
  endpoint of eight once left the other seven at 5% of their batches, their work held by
  samples backing off for it. The sample whose request was refused retries elsewhere
  (:meth:`EndpointRouter.avoid`, as for a stall). After ``endpoint_failure_threshold``
  overloads in a row with no success, the probe is asked once in the background: only when
  it fails too does the endpoint leave rotation.
  A permanent error is not a health failure either (the server answered).
- **A stall is about the endpoint**: a :class:`~regen.core.errors.StallError` (a stream that sent
  nothing for the stall timeout, regen.engine.stall) is counted as a stall; the sample's retry
  avoids that endpoint while another is up (:meth:`EndpointRouter.avoid`), and
  ``STALL_STREAK`` stalls in a row with no success between, or the stall watch's word that the
  whole server stopped (:meth:`EndpointRouter.stall`), take it out of rotation as ``stalled``
  (one warning). It comes back by a probe, as a down endpoint does (``/health_generate``
  generates a token: a hung scheduler fails it).
- **Refusal is about the endpoint**: an :class:`~regen.core.errors.EndpointFaultError` (401, 403,
  404, 405, 407, an answer that is not the protocol) takes the endpoint out of rotation at once
  and for the rest of the session ("refused": no probe brings it back, since a gateway that
  refuses chat requests may well pass health checks; a rerun tries it again), with one warning
  naming the endpoint, the status, the body's start and what to fix. When every endpoint is
  refused, :meth:`EndpointRouter.acquire` raises :class:`~regen.core.errors.NoEndpointLeftError`
  naming each; the sample is not failed (the caller leaves it for the next run).

All asyncio, single event loop; the clock is injectable for tests. Owns no files on disk;
``snapshot()`` is a plain dict for the progress file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from regen.client.endpoints import server_root
from regen.core.errors import (
    EndpointError,
    EndpointFaultError,
    NoEndpointLeftError,
    OverloadedError,
    PermanentError,
    StallError,
)

log = logging.getLogger(__name__)

UP = "up"
DOWN = "down"
STALLED = "stalled"  #: its streams stopped: out of rotation until a probe passes
HALF_OPEN = "half_open"
REFUSED = "refused"  #: an endpoint-wide fault: out for the session

#: async (url) -> True when the endpoint answers again
ProbeFn = Callable[[str], Awaitable[bool]]

#: states out of rotation that a probe (or a half-open trial) brings back
PROBED = frozenset({DOWN, STALLED})
#: the states from best to worst (what a view of several workers' routers shows: the worst)
SEVERITY = {UP: 0, HALF_OPEN: 1, DOWN: 2, STALLED: 3, REFUSED: 4}


def worse(a: str | None, b: str) -> str:
    """The worse of two endpoint states (``a`` None: ``b``)."""
    return b if a is None or SEVERITY.get(b, 0) > SEVERITY.get(a, 0) else a


#: stalls in a row (no success between) that take an endpoint out of rotation
STALL_STREAK = 2

#: seconds an endpoint gets no new request after an overload answer, while another is up;
#: doubled with each overload in a row, up to OVERLOAD_COOL_MAX_S (a success ends it)
OVERLOAD_COOL_S = 0.5
OVERLOAD_COOL_MAX_S = 8.0

#: weight of the newest latency in the moving average
LATENCY_EWMA_ALPHA = 0.2


@dataclass(slots=True)
class _State:
    url: str
    weight: float = 1.0
    limit: int | None = None
    in_flight: int = 0
    requests: int = 0
    ok: int = 0
    failures: int = 0
    throttled: int = 0  #: overload answers (503 / 429)
    consecutive_failures: int = 0
    consecutive_overloads: int = 0
    stalls: int = 0  #: requests cancelled as stalled
    consecutive_stalls: int = 0
    checking: bool = False  #: a health check after an overload streak is running
    cool_until: float | None = None  #: no new request before this while another is up
    slots_source: str | None = None  #: which server value sized the limit (EndpointInfo)
    state: str = UP
    down_since: float | None = None
    next_probe_at: float | None = None
    trial_in_flight: bool = False
    latency_sum_s: float = 0.0
    latency_ewma_s: float | None = None
    last_error: str | None = None
    refusal: str | None = None  #: why it was refused, and what to fix (state REFUSED)
    stall_reason: str | None = None  #: why it last left rotation as stalled
    others: float = 0.0  #: requests the server holds besides ours (its last reading)
    server: dict[str, Any] | None = None  #: the server's last reading (ServerLoad.to_dict)

    def has_room(self) -> bool:
        return self.limit is None or self.in_flight < self.limit

    def cooling(self, now: float) -> bool:
        return self.cool_until is not None and now < self.cool_until


@dataclass(slots=True)
class Lease:
    """One request's hold on an endpoint; give it back with :meth:`EndpointRouter.release`."""

    url: str
    sample_id: str
    started_at: float
    trial: bool = False  #: a half-open trial request


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
        self._eps: dict[str, _State] = {}
        for e in endpoints:
            if isinstance(e, str):
                st = _State(url=e.rstrip("/"))
            else:
                st = _State(
                    url=e.url,
                    weight=float(getattr(e, "weight", 1.0)),
                    limit=getattr(e, "max_running_requests", None),
                    slots_source=getattr(e, "slots_source", None),
                )
            self._eps[st.url] = st
        self.failure_threshold = failure_threshold
        self.probe_interval_s = probe_interval_s
        self._probe = probe
        self._clock = clock
        self._affinity: dict[str, str] = {}
        self._avoid: dict[str, set[str]] = {}  #: sample -> endpoints its requests stalled on
        self._changed = asyncio.Event()
        self._checks: set[asyncio.Task[None]] = set()

    @classmethod
    def from_engine(
        cls,
        endpoints: Sequence[Any],
        engine: Any,
        *,
        probe: ProbeFn | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> EndpointRouter:
        """Built with a :class:`regen.manifest.Engine`'s threshold and probe interval."""
        return cls(
            endpoints,
            failure_threshold=engine.endpoint_failure_threshold,
            probe_interval_s=engine.endpoint_probe_interval_s,
            probe=probe,
            clock=clock,
        )

    # ---- knobs and views -------------------------------------------------------------------

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
        s = self._eps[url]
        total = None if load is None else load.load
        if total is None:
            s.others, s.server = 0.0, None
            return
        s.others = max(0.0, total - s.in_flight)
        s.server = load.to_dict()

    def others(self, url: str) -> float:
        """Requests the server holds besides this router's (its last reading; 0: none)."""
        return self._eps[url].others

    def state(self, url: str) -> str:
        self._refresh(self._eps[url], self._clock())
        return self._eps[url].state

    def affinity(self, sample_id: str) -> str | None:
        return self._affinity.get(sample_id)

    def forget(self, sample_id: str) -> None:
        """Drop a finished sample's endpoint binding (and what it avoids)."""
        self._affinity.pop(sample_id, None)
        self._avoid.pop(sample_id, None)

    def avoid(self, sample_id: str, url: str) -> None:
        """This sample's next requests go to any other endpoint that is up (a request of it
        stalled on ``url``, or was refused as overloaded); to ``url`` only when no other is
        up."""
        self._avoid.setdefault(sample_id, set()).add(url)
        if self._affinity.get(sample_id) == url:
            del self._affinity[sample_id]

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per-endpoint stats as a plain JSON-able dict (for the progress snapshot)."""
        now = self._clock()
        out: dict[str, dict[str, Any]] = {}
        for url, s in self._eps.items():
            self._refresh(s, now)
            done = s.ok + s.failures + s.throttled
            out[url] = {
                "state": s.state,
                "in_flight": s.in_flight,
                "limit": s.limit,
                "weight": s.weight,
                "requests": s.requests,
                "ok": s.ok,
                "failures": s.failures,
                "throttled": s.throttled,
                "consecutive_failures": s.consecutive_failures,
                "consecutive_overloads": s.consecutive_overloads,
                "stalls": s.stalls,
                "slots_source": s.slots_source,
                "latency_avg_s": round(s.latency_sum_s / done, 4) if done else None,
                "latency_ewma_s": None if s.latency_ewma_s is None else round(s.latency_ewma_s, 4),
                "down_for_s": None if s.down_since is None else round(now - s.down_since, 3),
                "last_error": s.last_error,
                "refusal": s.refusal,
                "stall_reason": s.stall_reason,
                "server": s.server,
            }
        return out

    # ---- choosing ---------------------------------------------------------------------------

    def try_acquire(self, sample_id: str) -> Lease | None:
        """A lease on the endpoint for this sample's next request, or None if none has room."""
        now = self._clock()
        for s in self._eps.values():
            self._refresh(s, now)
        avoid = set(self._avoid.get(sample_id, ()))
        if avoid and not any(s.state == UP and u not in avoid for u, s in self._eps.items()):
            avoid = set()  # no other endpoint is up: the avoided one may serve it
        cool = {u for u, s in self._eps.items() if s.state == UP and s.cooling(now)}
        if cool and any(s.state == UP and u not in avoid | cool for u, s in self._eps.items()):
            avoid |= cool  # another is up: the endpoints that just refused get nothing new
        bound = self._affinity.get(sample_id)
        if bound is not None and bound not in avoid:
            s = self._eps[bound]
            if s.state == UP:
                return self._lease(s, sample_id, now) if s.has_room() else None
            if s.state == HALF_OPEN and not s.trial_in_flight:
                return self._lease(s, sample_id, now)
        chosen: _State | None = None
        for s in self._eps.values():
            if s.state == HALF_OPEN and not s.trial_in_flight and s.url not in avoid:
                chosen = s  # probe it with a real request first
                break
        if chosen is None:
            best = None
            for s in self._eps.values():
                if s.state != UP or not s.has_room() or s.url in avoid:
                    continue
                score = (s.in_flight + s.others + 1) / s.weight
                if best is None or score < best:
                    best, chosen = score, s
        if chosen is None:
            return None
        self._affinity[sample_id] = chosen.url
        return self._lease(chosen, sample_id, now)

    def refused(self) -> dict[str, str]:
        """The endpoints refused this session, each with why and what to fix."""
        return {u: s.refusal or "" for u, s in self._eps.items() if s.state == REFUSED}

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
        s.in_flight -= 1
        if lease.trial:
            s.trial_in_flight = False
        lat = now - lease.started_at if latency_s is None else latency_s
        s.latency_sum_s += lat
        s.latency_ewma_s = (
            lat
            if s.latency_ewma_s is None
            else (1 - LATENCY_EWMA_ALPHA) * s.latency_ewma_s + LATENCY_EWMA_ALPHA * lat
        )
        if error is None or isinstance(error, PermanentError):
            s.ok += 1
            self._succeeded(s)
        elif isinstance(error, EndpointFaultError):
            s.failures += 1
            s.last_error = f"{type(error).__name__}: {str(error)[:200]}"
            self._refuse(s, error)
        elif isinstance(error, StallError):
            s.failures += 1
            s.stalls += 1
            s.consecutive_stalls += 1
            s.last_error = f"{type(error).__name__}: {str(error)[:200]}"
            if s.state == HALF_OPEN:
                self._failed(s, now)
            elif s.consecutive_stalls >= STALL_STREAK:
                self.stall(s.url, f"{s.consecutive_stalls} streams in a row stalled")
        elif isinstance(error, OverloadedError):
            s.throttled += 1
            s.consecutive_overloads += 1
            s.last_error = type(error).__name__
            cool = OVERLOAD_COOL_S * 2 ** min(16, s.consecutive_overloads - 1)
            s.cool_until = now + min(OVERLOAD_COOL_MAX_S, cool)
            if s.consecutive_overloads >= self.failure_threshold:
                self._check_health(s)
        else:
            s.failures += 1
            s.last_error = f"{type(error).__name__}: {str(error)[:200]}"
            self._failed(s, now)
        self._notify()

    def abandon(self, lease: Lease) -> None:
        """Give a lease back without counting an outcome (the request was cancelled)."""
        s = self._eps[lease.url]
        s.in_flight -= 1
        if lease.trial:
            s.trial_in_flight = False
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

    # ---- health -----------------------------------------------------------------------------

    async def probe_once(self) -> list[str]:
        """Probe every endpoint out of rotation whose probe is due; return those back in."""
        if self._probe is None:
            return []
        now = self._clock()
        due = [
            s
            for s in self._eps.values()
            if s.state in PROBED and s.next_probe_at is not None and now >= s.next_probe_at
        ]
        back: list[str] = []
        for s in due:
            try:
                ok = await self._probe(s.url)
            except Exception:
                ok = False
            if ok:
                self._succeeded(s)
                back.append(s.url)
            else:
                s.next_probe_at = self._clock() + self.probe_interval_s
        if back:
            self._notify()
        return back

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

    def _lease(self, s: _State, sample_id: str, now: float) -> Lease:
        trial = s.state == HALF_OPEN
        if trial:
            s.trial_in_flight = True
        s.in_flight += 1
        s.requests += 1
        return Lease(url=s.url, sample_id=sample_id, started_at=now, trial=trial)

    def _refresh(self, s: _State, now: float) -> None:
        if (
            s.state in PROBED
            and self._probe is None
            and s.next_probe_at is not None
            and now >= s.next_probe_at
        ):
            s.state = HALF_OPEN

    def _check_health(self, s: _State) -> None:
        """After an overload streak, ask the probe once (in the background) whether the endpoint
        is busy or sick; only a failed probe takes it out of rotation."""
        if self._probe is None or s.checking or s.state != UP:
            return
        s.checking = True
        task = asyncio.get_running_loop().create_task(self._health_check(s))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _health_check(self, s: _State) -> None:
        assert self._probe is not None
        try:
            try:
                ok = await self._probe(s.url)
            except Exception:
                ok = False
            if ok:
                s.consecutive_overloads = 0  # busy, not sick
                return
            if s.state == UP:
                now = self._clock()
                s.state = DOWN
                s.down_since = now
                s.next_probe_at = now + self.probe_interval_s
                log.warning(
                    "endpoint %s out of rotation: %d overload answers in a row and its health "
                    "probe failed",
                    s.url,
                    s.consecutive_overloads,
                )
                self._notify()
        finally:
            s.checking = False

    def stall(self, url: str, why: str) -> bool:
        """Take an endpoint out of rotation as ``stalled`` (its streams stopped: ``why``);
        a probe brings it back. False when it was not up (already out)."""
        s = self._eps[url]
        if s.state not in (UP, HALF_OPEN):
            return False
        now = self._clock()
        s.state = STALLED
        s.down_since = now
        s.next_probe_at = now + self.probe_interval_s
        s.last_error = s.stall_reason = f"stalled: {why}"
        log.warning("endpoint %s stalled: %s; out of rotation, probed every %g s",
                    s.url, why, self.probe_interval_s)  # fmt: skip
        self._notify()
        return True

    def _refuse(self, s: _State, error: EndpointFaultError) -> None:
        if s.state == REFUSED:
            return
        s.state = REFUSED
        s.down_since = self._clock()
        s.next_probe_at = None
        s.refusal = f"{error}; fix: {error.fix}" if error.fix else str(error)
        log.warning("endpoint %s out of rotation for this session: %s", s.url, s.refusal)

    def _succeeded(self, s: _State) -> None:
        s.consecutive_failures = 0
        s.consecutive_overloads = 0
        s.cool_until = None
        s.consecutive_stalls = 0
        if s.state == REFUSED:  # a request sent before the refusal: it stays out
            return
        if s.state != UP:
            log.info("endpoint %s back in rotation", s.url)
            s.state = UP
            s.down_since = None
            s.next_probe_at = None

    def _failed(self, s: _State, now: float) -> None:
        s.consecutive_failures += 1
        if s.state == HALF_OPEN:
            s.state = DOWN
            s.next_probe_at = now + self.probe_interval_s
            log.warning("endpoint %s failed its trial request; still out of rotation", s.url)
        elif s.state == UP and s.consecutive_failures >= self.failure_threshold:
            s.state = DOWN
            s.down_since = now
            s.next_probe_at = now + self.probe_interval_s
            log.warning(
                "endpoint %s out of rotation after %d consecutive failures (last: %s)",
                s.url,
                s.consecutive_failures,
                s.last_error,
            )

    def _next_change_in(self) -> float | None:
        """Seconds until an endpoint may take requests again without a release: a cool-down
        ends, a half-open trial is due, or (with a probe task) a probe may have passed."""
        now = self._clock()
        waits = [s.cool_until - now for s in self._eps.values() if s.cooling(now)]
        if self._probe is not None:
            waits.append(self.probe_interval_s)
        else:
            waits += [s.next_probe_at - now for s in self._eps.values()
                      if s.state in PROBED and s.next_probe_at is not None]  # fmt: skip
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


#: seconds a probe waits: SGLang's /health_generate itself waits up to 20 s for the scheduler
PROBE_TIMEOUT_S = 30.0


async def http_probe(
    url: str, *, headers: dict[str, str] | None = None, timeout_s: float = PROBE_TIMEOUT_S
) -> bool:
    """Default probe: ``GET {root}/health_generate`` answers 200 (SGLang generates one token:
    a busy server passes, a hung one does not; ``/health`` would answer without generating).
    A server without that route (404/405, e.g. ``transformers serve``) is asked
    ``GET {url}/models`` instead, with ``headers`` (the API key)."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        try:
            async with http.get(f"{server_root(url)}/health_generate") as resp:
                if resp.status == 200:
                    return True
                if resp.status not in (404, 405):
                    return False
            async with http.get(f"{url}/models", headers=headers or {}) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False


def keyed_probe(headers_by_url: dict[str, dict[str, str]]) -> ProbeFn:
    """:func:`http_probe` that sends each endpoint its own ``Authorization`` header."""

    async def probe(url: str) -> bool:
        return await http_probe(url, headers=headers_by_url.get(url))

    return probe
