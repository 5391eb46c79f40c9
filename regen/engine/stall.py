"""Stall detection: a stream that stops sending, an endpoint whose requests all stop.

Owns no files. A server can fail by hanging (a GPU hang, a stuck collective, a half-open
connection): streams stay open with no bytes while ``/health`` may still answer. The request
timeout (``engine.request_timeout_s``, 30 minutes in production) is no detector for that;
this watch is. One :class:`StallWatch` per worker (regen.engine.worker), on its event loop:

- every request in flight holds a :class:`Beat`; the transport counts the pieces it receives
  on it (``beat.n += 1``: nothing else on the hot path), and the watch looks at the counts
  every ``tick`` (a few per stall timeout, at most one per second);
- **the stall timeout** of an endpoint is ``engine.stall_timeout_s`` when set; unset, it is
  ``GAP_MULTIPLE`` times the longest gap between two pieces of one stream it has shown over
  the last ``GAP_WINDOW_S`` seconds (as the watch saw them: at its tick's resolution), never
  below ``engine.stall_min_s``;
- **a stream** that has sent something and then nothing for its endpoint's stall timeout is
  cancelled: its request fails with :class:`~regen.core.errors.StallError` (the worker retries the
  sample on another endpoint: :meth:`regen.engine.router.EndpointRouter.avoid`), and the endpoint is
  checked;
- **an endpoint** with requests in flight of which none has made progress (a piece or an
  answer) for the stall timeout is checked too (a hung server sends no first byte either);
- **the check** (at most one at a time per endpoint) asks the server's own metrics first: when
  regen reads its ``/metrics`` page and the readings since its requests stopped show no new
  token (generated or prefilled), it is hung; when they show some, it is busy (other
  clients' work, or a long prefill: its queue holds ours), not hung. Without such readings
  the probe is asked (``/health_generate``, which generates a token: a hung scheduler fails
  it) within ``confirm_s``. A hung endpoint leaves rotation as ``stalled`` (one warning:
  :meth:`regen.engine.router.EndpointRouter.stall`) and every request it holds is cancelled with a
  ``StallError``, so each is retried elsewhere at once.

Every sample of a hung server thus finishes within about two stall timeouts of the hang
(detection, plus the check), plus its retry. Non-streamed requests show no progress until
their answer: only their endpoint's check applies to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from regen.client.server_load import ServerLoad
from regen.core.errors import StallError

log = logging.getLogger(__name__)

#: the derived stall timeout is this many times the longest gap an endpoint's streams showed
GAP_MULTIPLE = 4.0
#: seconds of gaps remembered for that
GAP_WINDOW_S = 600.0
#: the check's probe waits at most this part of the stall timeout (between the bounds below)
CONFIRM_PART = 0.5
CONFIRM_MIN_S, CONFIRM_MAX_S = 2.0, 20.0

#: async (url) -> True when the endpoint generates (regen.engine.router.ProbeFn)
Probe = Callable[[str], Awaitable[bool]]
#: (url, why) -> True when the endpoint just left rotation
#: (regen.engine.router.EndpointRouter.stall)
OnHung = Callable[[str, str], bool]


@dataclass(slots=True, eq=False)
class Beat:
    """One request in flight: the transport adds 1 to ``n`` per piece it receives."""

    url: str
    started: float
    moved_at: float  #: when the watch last saw ``n`` move (``started`` until then)
    n: int = 0
    seen: int = 0
    scope: asyncio.Timeout | None = None  #: what the watch fires to cancel the request
    stalled: str | None = None  #: why it was cancelled (None: it was not)

    def cancel(self, why: str) -> None:
        if self.stalled is None and self.scope is not None:
            self.stalled = why
            self.scope.reschedule(asyncio.get_running_loop().time())


@dataclass(slots=True)
class _Endpoint:
    beats: set[Beat] = field(default_factory=set)
    busy_since: float = 0.0  #: when its first request in flight began (0: none in flight)
    progress_at: float = 0.0  #: its last piece or answer
    gaps: deque[tuple[float, float]] = field(default_factory=deque)  #: (seen at, gap)
    checking: bool = False
    generated: float | None = None  #: its generation + prompt token counters, last reading
    generated_at: float | None = None  #: the reading at which that counter last moved
    readings: deque[float] = field(default_factory=lambda: deque(maxlen=8))  #: their times


class StallWatch:
    """Watches one worker's requests in flight; cancels what stalls (see the module doc)."""

    def __init__(
        self,
        urls: list[str],
        *,
        timeout_s: float | None,
        min_s: float,
        probe: Probe,
        on_hung: OnHung,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fixed_s, self.min_s = timeout_s, min_s
        self._eps = {u: _Endpoint() for u in urls}
        self._probe, self._on_hung, self._clock = probe, on_hung, clock
        self._checks: set[asyncio.Task[None]] = set()
        self.stalls = 0  #: requests this watch cancelled

    @property
    def tick_s(self) -> float:
        """How often the watch looks: a quarter of the shortest timeout, at most 1 s."""
        return max(0.05, min(1.0, (self.fixed_s or self.min_s) / 4))

    def timeout_s(self, url: str) -> float:
        """The stall timeout of ``url`` now."""
        if self.fixed_s is not None:
            return self.fixed_s
        gaps = self._eps[url].gaps
        longest = max((g for _, g in gaps), default=0.0)
        return max(self.min_s, GAP_MULTIPLE * longest)

    def confirm_s(self, url: str) -> float:
        return min(CONFIRM_MAX_S, max(CONFIRM_MIN_S, CONFIRM_PART * self.timeout_s(url)))

    @contextlib.asynccontextmanager
    async def watch(self, url: str) -> AsyncIterator[Beat]:
        """``async with watch.watch(url) as beat:`` one request; a stall cancels the body and
        raises :class:`StallError` here."""
        now = self._clock()
        ep = self._eps[url]
        beat = Beat(url=url, started=now, moved_at=now)
        if not ep.beats:
            ep.busy_since = now
        ep.beats.add(beat)
        ok = False
        try:
            async with asyncio.timeout(None) as scope:
                beat.scope = scope
                yield beat
            ok = True
        except TimeoutError:
            if beat.stalled is None:
                raise
            raise StallError(f"{url}: {beat.stalled}", endpoint=url) from None
        finally:
            ep.beats.discard(beat)
            if ok:
                ep.progress_at = self._clock()

    def read_metrics(self, url: str, load: ServerLoad | None) -> None:
        """One reading of the server's ``/metrics`` (a regen.client.server_load.ServerLoad; None:
        none fresh): notes when its generation counter moved."""
        ep = self._eps.get(url)
        if load is None or load.generation_tokens is None or ep is None:
            return
        if ep.readings and ep.readings[-1] == load.at:
            return
        # prompt tokens count too: a long prefill is work, though no token is generated yet
        tokens = load.generation_tokens + (load.prompt_tokens or 0.0)
        if ep.generated is not None and tokens != ep.generated:
            ep.generated_at = load.at
        ep.generated = tokens
        ep.readings.append(load.at)

    def scan(self) -> None:
        """One look at every request in flight (the watch's tick)."""
        now = self._clock()
        for url, ep in self._eps.items():
            limit = self.timeout_s(url)
            cutoff = now - GAP_WINDOW_S
            while ep.gaps and ep.gaps[0][0] < cutoff:
                ep.gaps.popleft()
            idle: list[Beat] = []
            for beat in ep.beats:
                if beat.n != beat.seen:
                    if beat.seen:  # a gap between two pieces (not the wait for the first)
                        ep.gaps.append((now, now - beat.moved_at))
                    beat.seen, beat.moved_at = beat.n, now
                    ep.progress_at = max(ep.progress_at, now)
                elif beat.seen and now - beat.moved_at >= limit and beat.stalled is None:
                    idle.append(beat)
            if idle:
                silent = now - min(b.moved_at for b in idle)
                why = (f"{len(idle)} stream(s) sent nothing for {silent:.0f} s (stall timeout "
                       f"{limit:.0f} s)")  # fmt: skip
                for beat in idle:
                    self.stalls += 1
                    beat.cancel(why)
                self._check(url, why)
            elif ep.beats and now - max(ep.progress_at, ep.busy_since) >= limit:
                silent = now - max(ep.progress_at, ep.busy_since)
                self._check(url, f"no request made progress for {silent:.0f} s "
                                 f"(stall timeout {limit:.0f} s)")  # fmt: skip

    def _check(self, url: str, why: str) -> None:
        ep = self._eps[url]
        if ep.checking:
            return
        ep.checking = True
        task = asyncio.get_running_loop().create_task(self._confirm(url, why))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    def _metrics_say(self, url: str, since: float) -> bool | None:
        """True: the readings since ``since`` show no generation (hung); False: they show
        some (busy); None: too few readings to tell."""
        ep = self._eps[url]
        if ep.generated_at is not None and ep.generated_at > since:
            return False
        if sum(1 for at in ep.readings if at > since) >= 2:
            return True
        return None

    async def _confirm(self, url: str, why: str) -> None:
        ep = self._eps[url]
        try:
            since = max(ep.progress_at, ep.busy_since)
            hung = self._metrics_say(url, since)
            how = "its /metrics show no generation since"
            if hung is None:
                how = "its health probe failed"
                try:
                    ok = await asyncio.wait_for(self._probe(url), self.confirm_s(url))
                except Exception:  # a timeout, or a probe that could not run
                    ok = False
                hung = not ok
            if not hung:
                log.debug("%s: %s, but it is generating (busy, not hung)", url, why)
                ep.progress_at = self._clock()
                return
            self._on_hung(url, f"{why}; {how}")
            for beat in list(ep.beats):
                self.stalls += beat.stalled is None
                beat.cancel(f"{url} stalled ({why})")
        finally:
            ep.checking = False

    async def run(self, stop: asyncio.Event) -> None:
        """Scan every tick until ``stop`` is set (a background task of the worker)."""
        while not stop.is_set():
            self.scan()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.tick_s)

    async def aclose(self) -> None:
        for task in list(self._checks):
            task.cancel()
        await asyncio.gather(*self._checks, return_exceptions=True)
