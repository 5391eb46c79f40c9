"""A worker's readings of the servers' ``/metrics`` pages. Owns no files.

Where an endpoint's engine serves a ``/metrics`` page regen reads (SGLang with
``--enable-metrics``, vLLM), a :class:`~regen.client.server_load.MetricsPoller` reads it every
few seconds in a task of its own, off the request path (:class:`ServerPages` starts them); each
reading goes to the worker (:meth:`regen.engine.worker.SampleWorker.read_server`): to the router
(what the server holds from other clients weighs in routing) and to the endpoint's limit, which
then follows the server's own queue (:meth:`Page.follow`,
:meth:`regen.engine.adaptive.AdaptiveLimit.follow`). The first round comes before the worker's
first request; while a server's ``--max-queued-requests`` paces the limit's growth, the page is
read again soon (:meth:`Page.pace`). An endpoint without a page, or whose reading went stale, is
scheduled by regen's own counts; that is said once (per worker).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from regen.client import ResolvedEndpoint
from regen.client.endpoints import server_root
from regen.client.server_load import (
    SCRAPE_INTERVAL_S,
    SCRAPE_TIMEOUT_S,
    SOON_S,
    MetricsPoller,
    PageClient,
    ServerLoad,
)
from regen.engine.adaptive import AdaptiveLimit, room, target_queue

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Page:
    """What a worker keeps of an endpoint whose ``/metrics`` page it reads."""

    poller: MetricsPoller
    slots: int | None  #: the server's batch slots (None: not reported)
    share: float  #: this worker's part of them (0-1)
    queue: int | None  #: requests its queue holds before a 503 (None: not reported)
    followed_at: float | None = None  #: the reading the limit last followed
    soon_s: float | None = None  #: the last wait asked while the queue paces the limit

    def fresh(self, load: ServerLoad) -> bool:
        """Whether ``load`` is a reading the limit has not followed yet (a failed round leaves
        the last one in place); it is taken as followed."""
        if self.followed_at == load.at:
            return False
        self.followed_at = load.at
        return True

    def follow(
        self, limit: AdaptiveLimit, load: ServerLoad, now: float, in_flight: int, waiting: bool
    ) -> int | None:
        """The new limit after following ``load`` (a reading that names the server's queue),
        None when it does not move."""
        assert load.queued is not None
        slots = self.slots
        more = room(load.queued, load.running, slots, target_queue(slots, limit.current))
        return limit.follow(now, room=more, in_flight=in_flight, share=self.share,
                            waiting=waiting,
                            queue_room=None if self.queue is None else self.queue - load.queued,
                            free_known=slots is not None and load.running is not None)  # fmt: skip

    def pace(self, paced: bool, *, grew: bool) -> float | None:
        """The wait to the next reading of a paced endpoint: SOON_S, or twice the page's last
        round trip when that is longer (requests sent now take about as long to reach a slow
        or busy server, and a reading before they arrive would count them as room), doubled
        after a reading that did not let the limit grow; None when not paced (the poller's
        interval)."""
        last, self.soon_s = self.soon_s, None
        if not paced:
            return None
        soon = max(SOON_S, 2 * self.poller.took_s)
        self.soon_s = soon if grew or last is None else max(soon, 2 * last)
        return self.soon_s


class ServerPages:
    """The pages of one worker's endpoints: their pollers, and whether each has had its first
    round."""

    def __init__(self) -> None:
        self.client = PageClient()
        self.pages: dict[str, Page] = {}  #: by endpoint URL, those regen reads
        self._tasks: list[asyncio.Task[None]] = []
        self._first_read = asyncio.Event()  #: every page has had its first round
        self._unread: set[str] = set()  #: pages whose first round has not come

    def add(
        self,
        endpoints: Sequence[ResolvedEndpoint],
        shares: dict[str, int] | None,
        headers: dict[str, dict[str, str]],
        *,
        enabled: bool,
        interval_s: float | None,
    ) -> None:
        """A page (and its poller) for each endpoint whose engine has one regen reads (none
        when not ``enabled``: ``engine.server_metrics: false``)."""
        for ep in endpoints:
            names = ep.profile.metrics
            if not enabled or names is None:
                why = f"{ep.profile.name} has none" if enabled else "engine.server_metrics: false"
                log.info("%s: no server metrics read (%s): scheduling by regen's own counts",
                         ep.public, why)  # fmt: skip
                continue
            total = ep.max_running_requests
            mine = (shares or {}).get(ep.url) or total
            share = min(1.0, mine / total) if total and mine else 1.0
            poller = MetricsPoller(self.client, server_root(ep.url), names, headers.get(ep.url),
                                   interval_s=interval_s or SCRAPE_INTERVAL_S)  # fmt: skip
            self.pages[ep.url] = Page(poller, total, share, ep.max_queued_requests)
        self._unread = set(self.pages)

    def start(self, read: Callable[[str], float | None]) -> None:
        """Start every poller (on the running loop); ``read(url)`` after each round."""
        loop = asyncio.get_running_loop()
        for url, page in self.pages.items():
            self._tasks.append(loop.create_task(page.poller.run(functools.partial(read, url))))
        if not self._tasks:
            self._first_read.set()

    def got(self, url: str) -> None:
        """``url``'s page had a round."""
        self._unread.discard(url)
        if not self._unread:
            self._first_read.set()

    async def first_readings(self) -> None:
        """Wait for each page's first round (bounded by its scrape timeout, and a second
        more in case a poller never reports), so the first requests already know what the
        servers hold from other clients: a shared server's limit starts below its slots."""
        if self._first_read.is_set():
            return
        try:
            async with asyncio.timeout(SCRAPE_TIMEOUT_S + 1.0):
                await self._first_read.wait()
        except TimeoutError:
            log.warning("no first reading of the servers' metrics in %g s: sending without it",
                        SCRAPE_TIMEOUT_S + 1.0)  # fmt: skip
            self._first_read.set()

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.aclose()
