"""A worker's lanes and slots: how many requests it may have in flight, per endpoint and in all.
Owns no files.

A worker keeps one :class:`Lane` per endpoint: the endpoint's :class:`~regen.client.ChatClient`,
its in-flight limit (:class:`regen.engine.adaptive.AdaptiveLimit`) and its metrics page when
regen reads one (:mod:`regen.engine.pages`). A lane's limit starts at this worker's share of the
server's ``max_running_requests`` (the driver splits it over the workers) plus 1/8 headroom, or,
without one reported, the worker's ``concurrency`` split over the endpoints
(:func:`starting_limits`). The worker's :class:`Slots` are the sum of its lanes' limits, never
past ``concurrency`` when the user set it (a hard cap per worker: regen.engine.adaptive).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from dataclasses import dataclass

from regen.client import ChatClient, ResolvedEndpoint, RetryPolicy
from regen.engine.adaptive import DEFAULT_CONCURRENCY, AdaptiveLimit, capped
from regen.engine.inputs import WorkerConfig
from regen.engine.pages import Page

#: starting limits are the server's slots plus 1/HEADROOM_DIVISOR of them (rounded up)
HEADROOM_DIVISOR = 8


class Slots:
    """A semaphore whose size can change; waiters are served first come, first served."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.used = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> bool:
        """Take a slot; True when it had to wait for one."""
        if self.used < self.capacity and not self._waiters:
            self.used += 1
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted just as we were cancelled
            elif fut in self._waiters:  # _wake may already have dropped it
                self._waiters.remove(fut)
            raise
        return True

    def release(self) -> None:
        self.used -= 1
        self._wake()

    def resize(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.used < self.capacity:
            fut = self._waiters.popleft()
            if not fut.done():
                self.used += 1
                fut.set_result(None)


def starting_limits(
    endpoints: Sequence[ResolvedEndpoint],
    concurrency: int | None,
    shares: dict[str, int] | None = None,
) -> dict[str, int]:
    """Per-endpoint starting in-flight limit (and floor) of one worker: the driver's share of
    the server's batch slots when given, else the server's max_running_requests, plus 1/8
    headroom (a finished request's slot is refilled from the server's short queue instead of
    idling for a client round trip); else ``concurrency`` (None: the default) split over the
    endpoints. A set ``concurrency`` caps each (regen.engine.adaptive: a limit is a limit)."""
    out: dict[str, int] = {}
    fallback = max(1, (concurrency or DEFAULT_CONCURRENCY) // max(1, len(endpoints)))
    for ep in endpoints:
        slots = slot_share(ep, shares)
        auto = slots + -(-slots // HEADROOM_DIVISOR) if slots else fallback
        out[ep.url] = capped(auto, concurrency)
    return out


def worker_slots(
    endpoints: Sequence[ResolvedEndpoint],
    concurrency: int | None,
    shares: dict[str, int] | None = None,
) -> int:
    """A worker's starting slots (requests in flight): its endpoints' limits, capped."""
    return capped(sum(starting_limits(endpoints, concurrency, shares).values()), concurrency)


def slot_share(endpoint: ResolvedEndpoint, shares: dict[str, int] | None) -> int | None:
    """This worker's share of an endpoint's reported batch slots (None: none reported)."""
    return (shares or {}).get(endpoint.url) or endpoint.max_running_requests


@dataclass(slots=True)
class Lane:
    """What a worker keeps of one endpoint: its client, its in-flight limit, and its metrics
    page when regen reads one (the router keeps the endpoint's health and leases)."""

    client: ChatClient
    limit: AdaptiveLimit
    page: Page | None = None


def open_lanes(
    config: WorkerConfig, retry: RetryPolicy, shares: dict[str, int] | None
) -> dict[str, Lane]:
    """One lane per endpoint of ``config``, by URL: its client and its limit, started at
    :func:`starting_limits` and allowed to grow to twice that (8 more at least), capped by the
    user's ``concurrency``."""
    starts = starting_limits(config.endpoints, config.concurrency, shares)
    lanes: dict[str, Lane] = {}
    for ep in config.endpoints:
        client = ChatClient.of(ep, config.client, retry=retry)
        start = starts[ep.url]
        most = capped(max(2 * start, start + 8), config.concurrency)
        limit = AdaptiveLimit(start=start, maximum=most, slots=slot_share(ep, shares))
        lanes[ep.url] = Lane(client, limit)
    return lanes


def capacity(lanes: dict[str, Lane], concurrency: int | None) -> int:
    """A worker's slots: its lanes' limits, never past the user's cap."""
    return capped(sum(lane.limit.current for lane in lanes.values()), concurrency)
