"""Adaptive in-flight limit of one endpoint, as seen from one worker. Owns no files.

The server is the expensive part: the limit starts at the worker's share of the server's
``max_running_requests`` (its batch slots) and moves once per window (``window_s`` and at
least ``min_requests`` completions, or any overload answer) on three signals the worker
measures itself:

- **throughput**: completion tokens per second finished in the window;
- **queueing**: the window's median time to first token against the best median seen so far
  (the baseline). A continuously batching server starts a request at its next step when a slot
  is free, so TTFT only grows by whole completions once requests wait in its queue;
- **demand**: whether work waited for a slot in this worker during the window (no demand: a
  higher limit could not be used, so nothing is learned).

Decisions, in order: an overload answer multiplies the limit by ``throttle_decrease`` and
lowers the floor with it (the server asked for less). How far: SGLang's 503 (queue full,
timeout abort, retraction) says its queue or memory is full, which an in-flight limit at the
server's own batch slots cannot cause; below them the batch would only run emptier, so a 503
cuts down to the worker's share of the reported slots (``slots``) and no further. A gateway's
429, or a 503 from a server that reports no slots, cuts without that bound (down to 1).
Then: queueing with no throughput gain (< ``gain``) steps down by ``step`` (never below the
floor, which starts at the starting limit: filling the slots the server reports cannot queue
on a server of our own); demand without queueing, or queueing that still bought throughput,
steps up by ``step``; otherwise the limit holds. Steps are
``max(1, step_fraction × limit)``: additive in effect, so the limit hovers just above the
server's slots, where a finished request's slot is refilled from the server's short queue
instead of waiting a round trip for the client.

The user's limit is a limit: ``engine.concurrency`` (``--concurrency``), when set, bounds the
requests in flight of each worker (actor), over all its endpoints, from start to end: the
server's slots may lower a worker's limit below it and never raise it past it
(:func:`capped`; regen.engine.worker applies it to every endpoint's ``maximum`` and to the
worker's slots). Unset (the default), the limits are automatic: the server's slots + 1/8, or
:data:`DEFAULT_CONCURRENCY` split over the endpoints when a server reports none.
:func:`describe_limit` is the start-up line's account of which limit won.

**The server's own queue**, where its ``/metrics`` page is read (regen.client.server_load, every
few seconds off the request path): each reading moves the limit so that the server's batch
is full and its queue, every client's requests included, holds :func:`target_queue` requests
(a small, non-empty queue: a finished request's slot is refilled at the server's next step,
and the queue is far from ``--max-queued-requests``, so a 503 is rare). :func:`room` is how
many more requests the server takes towards that: its free batch slots plus the target queue,
less what it queues (negative: too many). :meth:`AdaptiveLimit.follow` takes this worker's
share of it (``share``: its part of the server's slots, the other workers take theirs): more
room raises the limit while the limit is what holds work back; otherwise the limit comes down
to the requests in flight plus that share (requests already draining count as gone). The
first reading comes before the worker's first request (regen.engine.worker), so a server
busy with other clients' work gets fewer of regen's requests from the start, down to one.
Where the server reports ``--max-queued-requests`` (SGLang's ``/server_info``), growth is
also paced by it: requests sent at once wait in its queue until its next step admits them,
and SGLang refuses what arrives past that limit even with batch slots free, so the limit
never passes the requests in flight plus this worker's share of what the queue still takes
(:attr:`AdaptiveLimit.paced`; the worker then reads the page again soon, and the start
fills the slots in a few such bursts instead of one refused one).
While readings are fresh the window's queueing/grow steps stand down (the server says what
they guess); a 503 or 429 still cuts as above; ``maximum`` (and so ``engine.concurrency``)
still caps. Without readings (no page, a stale one) the window decides, as above.

The clock is the caller's (``now`` arguments), so tests drive it with synthetic signals.
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

#: requests in flight per worker when engine.concurrency is unset and no server reports slots
DEFAULT_CONCURRENCY = 64
#: the server's queue regen aims at, as a fraction of its batch slots (at least one request)
TARGET_QUEUE_FRACTION = 1 / 8


def room(queued: float, running: float | None, server_slots: int | None, target: int) -> float:
    """How many more requests a server takes before its queue (every client's) passes
    ``target``: its free batch slots plus ``target``, less its queue (negative: that many too
    many). Without its slots or running count, ``target`` less its queue."""
    if server_slots is None or running is None:
        return target - queued
    return server_slots - running + target - queued


def target_queue(server_slots: int | None, limit: int) -> int:
    """The queue a server should hold (all clients): 1/8 of its batch slots, at least one
    (``limit`` stands in for the slots of a server that reports none)."""
    return max(1, round(TARGET_QUEUE_FRACTION * (server_slots or limit)))


def capped(n: int, concurrency: int | None) -> int:
    """``n`` bounded by the user's limit (None: no user limit)."""
    return n if concurrency is None else max(1, min(n, concurrency))


def describe_limit(concurrency: int | None, automatic: int, reported: bool) -> str:
    """Which limit sets a worker's starting in-flight requests, as one flat phrase for the
    start-up line: ``automatic`` is what the servers' slots (``reported``) or the default would
    give, ``concurrency`` the user's."""
    auto = (
        f"the servers' batch slots + 1/8 = {automatic}"
        if reported
        else f"the default {DEFAULT_CONCURRENCY}, as no server reports its batch slots"
    )
    if concurrency is None:
        return f"set by {auto}; engine.concurrency / --concurrency would cap it"
    if concurrency < automatic:
        return f"capped by engine.concurrency / --concurrency = {concurrency}, below {auto}"
    return f"set by {auto}, under the cap engine.concurrency / --concurrency = {concurrency}"


@dataclass(slots=True, frozen=True)
class AdaptiveSettings:
    """Tuning of :class:`AdaptiveLimit` (internal; the defaults suit SGLang-like servers)."""

    window_s: float = 2.0  #: shortest decision window
    min_requests: int = 8  #: completions a window needs before a decision (overloads excepted)
    step_fraction: float = 0.04  #: step = max(1, step_fraction × limit)
    throttle_decrease: float = 0.7  #: limit multiplier on an overload answer (503 / 429)
    ttft_factor: float = 2.0  #: queueing when median TTFT > factor × baseline + slack
    ttft_slack_s: float = 0.05
    gain: float = 0.02  #: relative throughput rise that counts as growth


@dataclass(slots=True)
class Decision:
    """What one window decided (kept for logs and tests)."""

    at: float
    limit: int
    reason: str  #: "throttled" | "queueing" | "grow" | "hold" | "server" (a reading)
    throughput: float
    ttft_p50_s: float | None


@dataclass(slots=True)
class AdaptiveLimit:
    """The in-flight limit of one endpoint, adapted window by window."""

    start: int  #: starting limit (the worker's share of max_running_requests)
    maximum: int  #: hard cap
    settings: AdaptiveSettings = field(default_factory=AdaptiveSettings)
    #: the worker's share of the server's batch slots (None: not reported); a 503 cuts to it
    slots: int | None = None
    limit: float = 0.0
    floor: float = 1.0
    baseline_ttft_s: float | None = None
    last_throughput: float | None = None
    window_start: float | None = None
    tokens: int = 0
    requests: int = 0
    throttled: int = 0
    unbounded: bool = False  #: a throttle in this window may cut below ``slots`` (a 429)
    demand: bool = False
    #: a fresh reading of the server's queue leads (:meth:`follow`); the window only cuts
    server_led: bool = False
    #: the last reading's growth was held to what the server's queue takes at once
    paced: bool = False
    #: a reading found the limit full (before that, the whole limit would go out at once)
    filled: bool = False
    ttfts: list[float] = field(default_factory=list)
    history: list[Decision] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.start = max(1, self.start)
        self.maximum = max(self.start, self.maximum)
        self.limit = float(self.start)
        self.floor = float(self.start)

    @property
    def current(self) -> int:
        return round(self.limit)

    def record(self, now: float, completion_tokens: int, ttft_s: float | None) -> None:
        """One request finished (successfully) on this endpoint."""
        self._open(now)
        self.tokens += completion_tokens
        self.requests += 1
        if ttft_s is not None:
            self.ttfts.append(ttft_s)

    def record_throttled(self, now: float, *, rate_limited: bool = False) -> None:
        """The endpoint answered "overloaded": SGLang's 503, or a gateway's 429
        (``rate_limited``: the cut is not bounded by the server's slots)."""
        self._open(now)
        self.throttled += 1
        self.unbounded = self.unbounded or rate_limited

    def note_demand(self) -> None:
        """Work waited for a slot (a higher limit would have been used)."""
        self.demand = True

    def update(self, now: float) -> int | None:
        """Close the window when it is due; returns the new limit if it changed."""
        if self.window_start is None:
            return None
        s = self.settings
        elapsed = now - self.window_start
        if not self.throttled and (elapsed < s.window_s or self.requests < s.min_requests):
            return None
        before = self.current
        tput = self.tokens / elapsed if elapsed > 0 else 0.0
        p50 = statistics.median(self.ttfts) if self.ttfts else None
        queueing = False
        if p50 is not None:
            base = self.baseline_ttft_s
            queueing = base is not None and p50 > s.ttft_factor * base + s.ttft_slack_s
            self.baseline_ttft_s = p50 if base is None else min(base, p50)
        step = max(1.0, s.step_fraction * self.limit)
        grew = self.last_throughput is None or tput > self.last_throughput * (1 + s.gain)
        if self.throttled:
            cut = self.limit * s.throttle_decrease
            if self.slots and not self.unbounded:  # a 503: not below the server's own slots
                cut = max(cut, min(self.limit, float(self.slots)))
            self.limit = max(1.0, cut)
            self.floor = min(self.floor, self.limit)
            reason = "throttled"
        elif self.server_led:
            reason = "hold"  # the server's queue decides (follow)
        elif queueing and not grew:
            self.limit = max(self.floor, self.limit - step)
            reason = "queueing"
        elif self.demand:
            self.limit = min(float(self.maximum), self.limit + step)
            reason = "grow"
        else:
            reason = "hold"
        self.history.append(Decision(now, self.current, reason, tput, p50))
        if len(self.history) > 64:
            del self.history[:32]
        self.last_throughput = tput
        self.window_start = now
        self.tokens = self.requests = self.throttled = 0
        self.demand = self.unbounded = False
        self.ttfts = []
        if self.current != before:
            log.debug("limit %d -> %d (%s, %.0f tok/s, ttft p50 %s)",
                      before, self.current, reason, tput, p50)  # fmt: skip
            return self.current
        return None

    def follow(
        self,
        now: float,
        *,
        room: float,
        in_flight: int,
        share: float,
        waiting: bool = False,
        queue_room: float | None = None,
        free_known: bool = True,
    ) -> int | None:
        """One reading of the server: it takes ``room`` more requests (:func:`room`),
        ``in_flight`` are this worker's there now, ``share`` is this worker's part of the
        server's slots (0-1), ``waiting``: work waits for a slot in this worker;
        ``queue_room``: how many more its waiting queue takes before a 503 (its
        ``--max-queued-requests`` less what it queues; None: no limit known); ``free_known``:
        ``room`` counts the server's free batch slots (False: its slots are not reported, and
        a short queue says nothing of how many more it runs, so an unused limit is not
        lowered on it). Returns the new limit if it changed; :attr:`paced` says whether
        ``queue_room`` held it back."""
        self.server_led = True
        before = self.current
        held_back = in_flight >= before or waiting  # the limit is what holds work back
        self.filled = self.filled or in_flight >= before
        if room >= 0 and held_back:
            new = self.limit + share * room
        elif in_flight >= self.limit:  # full, or draining towards a lower limit: what is
            # in flight past the limit finishes without a refill, so it is room already made
            new = min(self.limit, self.limit + share * (room + in_flight - self.limit))
        elif room >= 0 and not free_known:  # unused, and how much the server runs is unknown
            new = self.limit
        else:  # the limit is not used: down to what is in flight plus this share of the room
            new = min(self.limit, in_flight + share * room)
        # what arrives at once waits in the queue until the server's next step admits it; once
        # the limit has been filled, what it lacks at a reading is refills of answers just
        # finished (their slots are free), so only growth past it is paced
        # (whole requests: the workers' shares of the queue add up to no more than it holds)
        burst: float | None = (
            None if queue_room is None else in_flight + math.floor(share * max(0.0, queue_room))
        )
        if burst is not None and self.filled:
            burst = max(burst, self.limit)
        self.paced = burst is not None and new > burst
        if burst is not None:
            new = min(new, burst)
        self.limit = max(1.0, min(float(self.maximum), new))
        if self.current == before:
            return None
        self.history.append(Decision(now, self.current, "server", 0.0, None))
        if len(self.history) > 64:
            del self.history[:32]
        log.debug("limit %d -> %d (the server takes %g more)", before, self.current, room)
        return self.current

    def unfollow(self) -> None:
        """No fresh reading any more: the window decides again."""
        self.server_led = False

    def _open(self, now: float) -> None:
        if self.window_start is None:
            self.window_start = now


def split(total: int, parts: int, index: int) -> int:
    """Share ``index`` of ``total`` split over ``parts`` (shares differ by at most one and
    add up to ``total``; every share is at least 1)."""
    base, extra = divmod(total, parts)
    return max(1, base + (1 if index < extra else 0))
