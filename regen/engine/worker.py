"""One worker: turns samples into rows with up to C requests in flight.

Owns no files. A :class:`SampleWorker` lives inside a Ray actor (see :mod:`regen.engine.actor`)
or, in unit tests, on a plain event loop. It holds one :class:`~regen.client.ChatClient` per
endpoint and one :class:`~regen.engine.router.EndpointRouter`; every try of every request takes a
lease from the router (least outstanding, sample affinity, health), so all turns of a sample go to
the same endpoint while it is healthy, and a failing endpoint leaves rotation between retries.

A sample holds one of the worker's slots from its first request to its last, so multi-turn
chains are not starved by newer samples (a sample has one request in flight at a time, so
slots = requests in flight). The slots are the sum of the endpoints' in-flight limits, each an
:class:`regen.engine.adaptive.AdaptiveLimit` started at this worker's share of the server's
``max_running_requests`` (the driver splits it over the workers; without one reported, the
worker's ``concurrency`` split over the endpoints) and moved on the worker's own throughput,
TTFT and overload (503/429) signals, never past ``concurrency`` when the user set it (a hard
cap per worker: regen.engine.adaptive). Rows are built (tokenized) off the event loop.

Where an endpoint's engine serves a ``/metrics`` page regen reads (SGLang with
``--enable-metrics``, vLLM), a :class:`~regen.client.server_load.MetricsPoller` reads it every few
seconds in a task of its own, off the request path; each reading goes to the router (what the
server holds from other clients weighs in routing) and to the endpoint's limit (which then
follows the server's own queue: :meth:`regen.engine.adaptive.AdaptiveLimit.follow`). The
first round comes before the worker's first request; while a server's
``--max-queued-requests`` paces the limit's growth, the page is read again soon. An endpoint
without a page, or whose reading went stale, is scheduled as above; that is said once (per
worker).

Every request is watched for stalls (:mod:`regen.engine.stall`): a stream that stops sending
for the stall timeout is cancelled and its sample retried on another endpoint, and an endpoint
whose requests all stop leaves rotation as ``stalled`` (its metrics readings go to the watch
too).

An endpoint-wide fault (:class:`regen.core.errors.EndpointFaultError`: 401, 403, 404, not the
protocol) is never the sample's: the router takes that endpoint out and the request is sent
again elsewhere at once (not counted as a try). With no endpoint left the sample's outcome is
``unsent``: not failed, not recorded; the dispatch stops the session (regen.engine.dispatch).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from regen.client import ChatClient, RetryPolicy, auth_headers, resolve_api_key
from regen.client.endpoints import server_root
from regen.client.server_load import (
    SCRAPE_INTERVAL_S,
    SCRAPE_TIMEOUT_S,
    SOON_S,
    MetricsPoller,
    PageClient,
)
from regen.core.errors import (
    EndpointFaultError,
    NoEndpointLeftError,
    OverloadedError,
    RateLimitedError,
    RegenError,
    RequestError,
    StallError,
    TransientError,
)
from regen.core.result import TurnResult
from regen.core.sample import Sample
from regen.engine.adaptive import (
    DEFAULT_CONCURRENCY,
    AdaptiveLimit,
    capped,
    room,
    target_queue,
)
from regen.engine.router import EndpointRouter, keyed_probe
from regen.engine.rows import build_rows
from regen.engine.stall import StallWatch
from regen.engine.turns import DoneTurn, regenerate
from regen.manifest import Endpoint, Manifest
from regen.plan.attempts import attempt_seed
from regen.store.progress import ErrorInfo
from regen.template.render import Renderer, RenderSetup

log = logging.getLogger(__name__)

#: (sample, done turns) -> rows; default: regen.engine.rows.build_turn_row with the manifest's
#: renderer
RowBuilder = Callable[[Sample, list[DoneTurn]], list[dict[str, Any]]]


@dataclass(slots=True)
class SampleOutcome:
    """What happened to one sample: its rows, or why it has none."""

    sample_id: str
    source: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: "done" | "permanent" | "transient" | "unsent" (no endpoint left: not the sample's)
    status: str = "done"
    kind: str = ""  #: error class (RegenError.kind) when not done
    http_status: int | None = None
    message: str = ""
    attempts: int = 0  #: tries of the failing request
    requests: int = 0  #: tries of all requests of this sample
    slots: int = 0  #: the worker's slots when it finished (the driver feeds slots + prefetch)


@dataclass(slots=True)
class WorkerStats:
    """Counters of one worker since it started (the driver sums them over workers)."""

    in_flight: int = 0  #: requests in flight now
    sent: int = 0  #: tries sent
    ok: int = 0
    retried: int = 0  #: tries that failed transiently and were retried
    failed: int = 0  #: requests given up (permanent, or transient after max_attempts)
    errors: dict[str, ErrorInfo] = field(default_factory=dict)
    latencies: dict[str, list[float]] = field(default_factory=dict)  #: recent, per endpoint
    #: per endpoint: [prompt tokens, cached tokens] of the answers whose server reported its
    #: prefix cache (``cached_tokens``): the endpoint's cache-hit rate
    cache: dict[str, list[int]] = field(default_factory=dict)

    def error(self, kind: str, message: str) -> None:
        self.errors.setdefault(kind, ErrorInfo()).add(message, time.time())


def default_row_builder(manifest: Manifest, setup: RenderSetup | None = None) -> RowBuilder:
    """Rows through regen.engine.rows.build_rows with the manifest's renderer (one batch of
    tokenizer work per sample; loaded and rendering as the run's ``setup`` says,
    :class:`regen.template.render.RenderSetup`); every turn's quality is checked there (the
    manifest's ``quality`` thresholds, docs/quality.md), and every row records the manifest's
    settings id (``Manifest.settings_id``)."""

    renderer = Renderer.from_manifest(manifest, setup)
    quality = manifest.quality
    settings = manifest.settings_id()

    def build(sample: Sample, turns: list[DoneTurn]) -> list[dict[str, Any]]:
        turn_inputs = [(t.turn, t.request_messages, t.result) for t in turns]
        return build_rows(sample, turn_inputs, renderer, quality, settings)

    return build


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
    endpoints: list[Any], concurrency: int | None, shares: dict[str, int] | None = None
) -> dict[str, int]:
    """Per-endpoint starting in-flight limit (and floor) of one worker: the driver's share of
    the server's batch slots when given, else the server's max_running_requests, plus 1/8
    headroom (a finished request's slot is refilled from the server's short queue instead of
    idling for a client round trip); else ``concurrency`` (None: the default) split over the
    endpoints. A set ``concurrency`` caps each (regen.engine.adaptive: a limit is a limit)."""
    out: dict[str, int] = {}
    fallback = max(1, (concurrency or DEFAULT_CONCURRENCY) // max(1, len(endpoints)))
    for info in endpoints:
        slots = slot_share(info, shares)
        auto = slots + -(-slots // HEADROOM_DIVISOR) if slots else fallback
        out[info.url] = capped(auto, concurrency)
    return out


def worker_slots(
    endpoints: list[Any], concurrency: int | None, shares: dict[str, int] | None = None
) -> int:
    """A worker's starting slots (requests in flight): its endpoints' limits, capped."""
    return capped(sum(starting_limits(endpoints, concurrency, shares).values()), concurrency)


def slot_share(info: Any, shares: dict[str, int] | None) -> int | None:
    """This worker's share of an endpoint's reported batch slots (None: none reported)."""
    return (shares or {}).get(info.url) or getattr(info, "max_running_requests", None)


@dataclass(slots=True)
class Page:
    """What a worker keeps of an endpoint whose ``/metrics`` page it reads."""

    poller: MetricsPoller
    slots: int | None  #: the server's batch slots (None: not reported)
    share: float  #: this worker's part of them (0-1)
    queue: int | None  #: requests its queue holds before a 503 (None: not reported)
    followed_at: float | None = None  #: the reading the limit last followed
    soon_s: float | None = None  #: the last wait asked while the queue paces the limit


@dataclass(slots=True)
class Lane:
    """What a worker keeps of one endpoint: its client, its in-flight limit, and its metrics
    page when regen reads one (the router keeps the endpoint's health and leases)."""

    client: ChatClient
    limit: AdaptiveLimit
    page: Page | None = None


class SampleWorker:
    """Regenerates samples against a set of endpoints; C requests in flight at most."""

    def __init__(
        self,
        manifest: Manifest,
        endpoints: list[Any],
        concurrency: int | None,
        *,
        row_builder: RowBuilder | None = None,
        retry: Any = None,
        probe: Any = None,
        shares: dict[str, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        server_metrics: bool | None = None,
        metrics_interval_s: float | None = None,
    ) -> None:
        """``endpoints``: :class:`regen.client.EndpointInfo` (from the start check) or
        :class:`regen.manifest.Endpoint`; keys are read from the endpoints' env/file.
        ``shares``: this worker's starting in-flight limit per endpoint URL (see
        :func:`starting_limits`). ``server_metrics``: read the servers' ``/metrics`` pages
        (False: schedule by regen's own counts only, as without a page; None: the manifest's
        ``engine.server_metrics``); every
        ``metrics_interval_s`` (None: regen.client.server_load.SCRAPE_INTERVAL_S)."""

        self.manifest = manifest
        self.retry = retry or RetryPolicy.from_engine(manifest.engine)
        self.concurrency = concurrency  #: the user's cap per worker (None: automatic)
        self._clock = clock
        by_url = {e.url: e for e in manifest.endpoints}
        starts = starting_limits(endpoints, concurrency, shares)
        headers: dict[str, dict[str, str]] = {}
        #: per endpoint URL, what this worker keeps of it
        self.lanes: dict[str, Lane] = {}
        for info in endpoints:
            ep = by_url.get(info.url) or (info if isinstance(info, Endpoint) else None)
            ep = ep or Endpoint(url=info.url, weight=getattr(info, "weight", 1.0))
            # an EndpointInfo names the engine the start check recognised; a bare Endpoint
            # (unit tests) is taken for SGLang, the production engine
            client = ChatClient.from_manifest(
                manifest,
                ep,
                retry=self.retry,
                engine=getattr(info, "engine", None),
                engine_version=getattr(info, "version", None),
            )
            start = starts[info.url]
            most = capped(max(2 * start, start + 8), concurrency)
            limit = AdaptiveLimit(start=start, maximum=most, slots=slot_share(info, shares))
            self.lanes[info.url] = Lane(client, limit)
            headers[info.url] = auth_headers(resolve_api_key(ep, manifest.base_dir))
        probe = probe if probe is not None else keyed_probe(headers)
        self.router = EndpointRouter.from_engine(endpoints, manifest.engine, probe=probe)
        eng = manifest.engine
        self.watch = StallWatch([info.url for info in endpoints], timeout_s=eng.stall_timeout_s,
                                min_s=eng.stall_min_s, probe=probe, on_hung=self.router.stall,
                                clock=clock)  # fmt: skip
        for url, lane in self.lanes.items():
            self.router.set_limit(url, lane.limit.current)
        self.slots = Slots(self._capacity())
        if server_metrics is None:
            server_metrics = manifest.engine.server_metrics
        self._add_pages(endpoints, headers, shares, server_metrics, metrics_interval_s)
        self.stats = WorkerStats()
        self._rows = row_builder or default_row_builder(manifest)
        self._probe_stop = asyncio.Event()
        self._probe_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None

    def _add_pages(
        self,
        endpoints: list[Any],
        headers: dict[str, dict[str, str]],
        shares: dict[str, int] | None,
        enabled: bool,
        interval_s: float | None,
    ) -> None:
        """A page (and its poller) for each endpoint whose engine has one regen reads."""

        self.pages = PageClient()
        self._poll_tasks: list[asyncio.Task[None]] = []
        self._first_read = asyncio.Event()  #: every page has had its first round
        for info in endpoints:
            client = self.lanes[info.url].client
            names = client.profile.metrics
            if not enabled or names is None:
                why = (
                    f"{client.profile.name} has none" if enabled else "engine.server_metrics: false"
                )
                log.info("%s: no server metrics read (%s): scheduling by regen's own counts",
                         client.url, why)  # fmt: skip
                continue
            total = getattr(info, "max_running_requests", None)
            mine = slot_share(info, shares)
            share = min(1.0, mine / total) if total and mine else 1.0
            poller = MetricsPoller(
                self.pages, server_root(info.url), names, headers.get(info.url),
                interval_s=interval_s or SCRAPE_INTERVAL_S,
            )  # fmt: skip
            queue = getattr(info, "max_queued_requests", None)
            self.lanes[info.url].page = Page(poller, total, share, queue)
        #: pages whose first round has not come
        self._unread = {url for url, lane in self.lanes.items() if lane.page is not None}

    def _ensure_probes(self) -> None:
        if self._probe_task is None:
            loop = asyncio.get_running_loop()
            self._probe_task = loop.create_task(self.router.run_probes(self._probe_stop))
            self._watch_task = loop.create_task(self.watch.run(self._probe_stop))
            for url, lane in self.lanes.items():
                if lane.page is not None:
                    read = lane.page.poller.run(lambda url=url: self.read_server(url))
                    self._poll_tasks.append(loop.create_task(read))
            if not self._poll_tasks:
                self._first_read.set()

    async def _first_readings(self) -> None:
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

    def read_server(self, url: str) -> float | None:
        """The latest reading of ``url``'s page: to the router, and to the endpoint's limit.
        Returns the seconds to the next reading while the server's queue paces the limit's
        growth (SOON_S after a reading that let it grow, twice the last wait after one that
        did not), None otherwise (the poller's interval)."""
        self._unread.discard(url)
        if not self._unread:
            self._first_read.set()
        lane = self.lanes[url]
        page, ctl = lane.page, lane.limit
        if page is None:  # only a page's poller calls this
            return None
        load = page.poller.latest
        self.router.set_server_load(url, load)
        self.watch.read_metrics(url, load)
        if load is None or load.queued is None:
            ctl.unfollow()
            return None
        if page.followed_at == load.at:  # a failed round: that reading was followed
            return None
        page.followed_at = load.at
        slots, before = page.slots, ctl.current
        more = room(load.queued, load.running, slots, target_queue(slots, before))
        new = ctl.follow(self._clock(), room=more, in_flight=self.router.in_flight(url),
                         share=page.share, waiting=self.slots.waiting > 0,
                         queue_room=None if page.queue is None else page.queue - load.queued,
                         free_known=slots is not None and load.running is not None)  # fmt: skip
        if new is not None:
            self.router.set_limit(url, new)
            self.slots.resize(self._capacity())
        return self._pace(page, ctl.paced, grew=new is not None and new > before)

    @staticmethod
    def _pace(page: Page, paced: bool, *, grew: bool) -> float | None:
        """The wait to the next reading of a paced endpoint: SOON_S, or twice the page's last
        round trip when that is longer (requests sent now take about as long to reach a slow
        or busy server, and a reading before they arrive would count them as room), doubled
        after a reading that did not let the limit grow."""

        last, page.soon_s = page.soon_s, None
        if not paced:
            return None
        soon = max(SOON_S, 2 * page.poller.took_s)
        page.soon_s = soon if grew or last is None else max(soon, 2 * last)
        return page.soon_s

    async def _complete(
        self,
        out: SampleOutcome,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        seed: int | None = None,
    ) -> TurnResult:
        """One turn: each try leases an endpoint; transient failures retried per the policy.
        ``seed`` replaces the sampling seed (a new attempt, regen.plan.attempts)."""
        st = self.stats
        sample_id = out.sample_id

        async def attempt(n: int) -> TurnResult:
            async with self.router.lease(sample_id) as lease:
                st.sent += 1
                out.requests += 1
                st.in_flight += 1
                t0 = time.monotonic()
                try:
                    async with self.watch.watch(lease.url) as beat:
                        res = await self.lanes[lease.url].client.complete_once(
                            messages, tools, sample_id=sample_id, seed=seed, beat=beat
                        )
                except StallError:  # its retry goes to another endpoint while one is up
                    self.router.avoid(sample_id, lease.url)
                    raise
                except OverloadedError as e:  # 503 (SGLang) or 429: back off, never "down";
                    self.router.avoid(sample_id, lease.url)  # its retry goes elsewhere
                    limit = self.lanes[lease.url].limit
                    limit.record_throttled(
                        self._clock(), rate_limited=isinstance(e, RateLimitedError)
                    )
                    self._adapt(lease.url)
                    raise
                finally:
                    st.in_flight -= 1
                lat = st.latencies.setdefault(lease.url, [])
                lat.append(time.monotonic() - t0)
                if len(lat) > 256:
                    del lat[:128]
                if res.cached_tokens is not None and res.prompt_tokens:
                    counts = st.cache.setdefault(lease.url, [0, 0])
                    counts[0] += res.prompt_tokens
                    counts[1] += res.cached_tokens
                limit = self.lanes[lease.url].limit
                limit.record(self._clock(), res.completion_tokens or 0, res.ttft_s)
                self._adapt(lease.url)
                return res

        def on_failure(err: TransientError, n: int, wait: float) -> None:
            st.error(err.kind, str(err))
            if n < self.retry.max_attempts:
                st.retried += 1

        while True:
            try:
                result, attempts = await self.retry.call(attempt, on_failure=on_failure)
                break
            except EndpointFaultError as e:  # the router took that endpoint out: go elsewhere
                st.error(e.kind, str(e))  # (acquire raises NoEndpointLeftError at the end)
        result.attempts = attempts
        st.ok += 1
        return result

    def _adapt(self, url: str) -> None:
        ctl = self.lanes[url].limit
        if self.slots.waiting:
            ctl.note_demand()
        new = ctl.update(self._clock())
        if new is not None:
            self.router.set_limit(url, new)
            self.slots.resize(self._capacity())

    def _capacity(self) -> int:
        """The worker's slots: its endpoints' limits, never past the user's cap."""
        return capped(sum(lane.limit.current for lane in self.lanes.values()), self.concurrency)

    async def process(self, sample: Sample) -> SampleOutcome:
        """All turns of one sample, then its rows; failures become an outcome, not an error."""
        self._ensure_probes()
        await self._first_readings()
        out = SampleOutcome(sample.id, sample.source)
        try:
            if await self.slots.acquire():
                for lane in self.lanes.values():
                    lane.limit.note_demand()
            seed = attempt_seed(self.manifest.sampling.seed, sample.attempt)
            try:
                conv = await regenerate(
                    sample, lambda msgs, tools: self._complete(out, msgs, tools, seed)
                )
            finally:
                self.slots.release()
            out.rows = await asyncio.to_thread(self._rows, sample, conv.turns)
            if conv.ended is not None and out.rows:  # why the conversation stopped early
                out.rows[-1]["ended"] = conv.ended
        except NoEndpointLeftError as e:  # not the sample's fault: left for the next run
            out.status, out.kind, out.message = "unsent", e.kind, str(e)[:1000]
        except RequestError as e:
            self.stats.failed += 1
            if not isinstance(e, TransientError):
                self.stats.error(e.kind, str(e))
            out.status = "transient" if isinstance(e, TransientError) else "permanent"
            out.kind, out.http_status, out.message = e.kind, e.status, str(e)[:1000]
            out.attempts = int(getattr(e, "attempts", 1) or 1)
        except RegenError as e:  # a row that cannot be built (template, bad row): permanent
            self.stats.error(e.kind, str(e))
            out.status, out.kind, out.message = "permanent", e.kind, str(e)[:1000]
        finally:
            self.router.forget(sample.id)
        out.slots = self.slots.capacity
        return out

    def snapshot(self) -> dict[str, Any]:
        """Counters and per-endpoint state, as plain data for the driver."""
        st = self.stats
        return {
            "in_flight": st.in_flight,
            "sent": st.sent,
            "ok": st.ok,
            "retried": st.retried,
            "failed": st.failed,
            "errors": {k: [v.count, v.last_message, v.last_at] for k, v in st.errors.items()},
            "endpoints": self.router.snapshot(),
            "latencies": {u: list(v[-64:]) for u, v in st.latencies.items()},
            "cache": {u: list(v) for u, v in st.cache.items()},
            "slots": self.slots.capacity,
            "limits": {u: lane.limit.current for u, lane in self.lanes.items()},
        }

    async def aclose(self) -> None:
        self._probe_stop.set()
        for bg in (self._probe_task, self._watch_task):
            if bg is not None:
                bg.cancel()
        await self.watch.aclose()
        for task in self._poll_tasks:
            task.cancel()
        await asyncio.gather(*self._poll_tasks, return_exceptions=True)
        await self.pages.aclose()
        for lane in self.lanes.values():
            try:
                await lane.client.aclose()
            except Exception as e:  # closing is best effort
                log.debug("closing client: %s", e)
