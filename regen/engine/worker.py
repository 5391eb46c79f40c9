"""One worker: turns samples into rows with up to C requests in flight.

Owns no files. A :class:`SampleWorker` lives inside a Ray actor (see :mod:`regen.engine.actor`)
or, in unit tests, on a plain event loop; it runs with a :class:`regen.engine.inputs.WorkerConfig`
(the driver's one cut of the manifest) and never sees the manifest. It holds one lane per
endpoint (:mod:`regen.engine.lanes`: the endpoint's :class:`~regen.client.ChatClient` and its
in-flight limit) and one :class:`~regen.engine.router.EndpointRouter`; every try of every request
takes a lease from the router (least outstanding, sample affinity, health), so all turns of a
sample go to the same endpoint while it is healthy, and a failing endpoint leaves rotation
between retries.

A sample holds one of the worker's slots from its first request to its last, so multi-turn
chains are not starved by newer samples (a sample has one request in flight at a time, so
slots = requests in flight). The slots are the sum of the endpoints' in-flight limits, each an
:class:`regen.engine.adaptive.AdaptiveLimit` started at this worker's share of the server's
``max_running_requests`` (the driver splits it over the workers; without one reported, the
worker's ``concurrency`` split over the endpoints) and moved on the worker's own throughput,
TTFT and overload (503/429) signals, never past ``concurrency`` when the user set it (a hard
cap per worker: regen.engine.adaptive), and on what the servers' ``/metrics`` pages say
(:mod:`regen.engine.pages`: each reading goes to the router and to the endpoint's limit,
:meth:`SampleWorker.read_server`). Rows are built (tokenized, by the renderer of the target's
family: regen.template.render) off the event loop.

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
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

from regen.client import RetryPolicy
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
from regen.core.jsontext import JsonValue
from regen.core.result import TurnResult
from regen.core.sample import Sample
from regen.engine.inputs import RowSettings, WorkerConfig
from regen.engine.lanes import Slots, capacity, open_lanes
from regen.engine.pages import ServerPages
from regen.engine.router import EndpointRouter, ProbeFn, keyed_probe
from regen.engine.rows import build_rows
from regen.engine.stall import StallWatch
from regen.engine.turns import DoneTurn, Request, Tools, regenerate
from regen.plan.attempts import attempt_seed
from regen.store.progress import ErrorInfo
from regen.template.render import Renderer

log = logging.getLogger(__name__)

#: a training row (regen.store.schema names its columns)
Row = dict[str, JsonValue]
#: (sample, done turns) -> rows; default: regen.engine.rows.build_rows with the run's renderer
RowBuilder = Callable[[Sample, list[DoneTurn]], list[Row]]


class ErrorSnapshot(TypedDict):
    """One error class of a worker: how often, the latest message and when."""

    count: int
    message: str
    at: float


class WorkerSnapshot(TypedDict):
    """A worker's counters and per-endpoint state (:meth:`SampleWorker.snapshot`): what the
    driver sums over its workers (regen.engine.tracker.ProgressTracker.workers)."""

    in_flight: int
    sent: int
    ok: int
    retried: int
    failed: int
    errors: dict[str, ErrorSnapshot]
    #: per endpoint URL: the router's view (regen.engine.router.EndpointRouter.snapshot)
    endpoints: dict[str, dict[str, Any]]
    latencies: dict[str, list[float]]  #: per endpoint URL, the latest ones
    cache: dict[str, list[int]]  #: per endpoint URL: prompt tokens, cached tokens
    slots: int
    limits: dict[str, int]  #: per endpoint URL


@dataclass(slots=True)
class SampleOutcome:
    """What happened to one sample: its rows, or why it has none."""

    sample_id: str
    source: str
    rows: list[Row] = field(default_factory=list)
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

    def answered(self, url: str, took_s: float, result: TurnResult) -> None:
        """One answer of ``url``: its latency, and its prompt's cache hits when reported."""
        lat = self.latencies.setdefault(url, [])
        lat.append(took_s)
        if len(lat) > 256:
            del lat[:128]
        if result.cached_tokens is not None and result.prompt_tokens:
            counts = self.cache.setdefault(url, [0, 0])
            counts[0] += result.prompt_tokens
            counts[1] += result.cached_tokens


def default_row_builder(settings: RowSettings) -> RowBuilder:
    """Rows through regen.engine.rows.build_rows with the run's renderer (one batch of
    tokenizer work per sample; loaded and rendering as ``settings.render`` says, the renderer
    of the target's family: :class:`regen.template.render.Renderer`); every turn's quality is
    checked there (``settings.quality``, docs/quality.md), and every row records the run's
    settings id."""

    renderer = Renderer.of(settings.render)
    quality, settings_id = settings.quality, settings.settings_id

    def build(sample: Sample, turns: list[DoneTurn]) -> list[Row]:
        turn_inputs = [(t.turn, t.request_messages, t.result) for t in turns]
        return build_rows(sample, turn_inputs, renderer, quality, settings_id)

    return build


class SampleWorker:
    """Regenerates samples against a set of endpoints; C requests in flight at most."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        row_builder: RowBuilder | None = None,
        retry: RetryPolicy | None = None,
        probe: ProbeFn | None = None,
        shares: dict[str, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        metrics_interval_s: float | None = None,
    ) -> None:
        """``config``: the endpoints (resolved by the start check) and settings the driver cut
        from the manifest; keys are read from the endpoints' env/file. ``retry`` replaces the
        policy of ``config.retry`` (tests inject its sleep); ``probe``: how an endpoint out of
        rotation is probed (None: ``/health_generate`` with its key); ``shares``: this
        worker's starting in-flight limit per endpoint URL (see
        :func:`regen.engine.lanes.starting_limits`); the servers' ``/metrics`` pages are read
        (``config.server_metrics``) every ``metrics_interval_s`` (None:
        regen.client.server_load.SCRAPE_INTERVAL_S)."""

        self.config = config
        self.retry = retry or RetryPolicy.of(config.retry)
        self.concurrency = config.concurrency  #: the user's cap per worker (None: automatic)
        self._clock = clock
        #: per endpoint URL, what this worker keeps of it
        self.lanes = open_lanes(config, self.retry, shares)
        headers = {ep.url: ep.headers() for ep in config.endpoints}
        probe = probe if probe is not None else keyed_probe(headers)
        self.router = self._router(config, probe, clock)
        self.watch = StallWatch(list(self.lanes), timeout_s=config.stall.timeout_s,
                                min_s=config.stall.min_s, probe=probe, on_hung=self.router.stall,
                                clock=clock)  # fmt: skip
        self.slots = Slots(self._capacity())
        self.pages = ServerPages()
        self.pages.add(config.endpoints, shares, headers, enabled=config.server_metrics,
                       interval_s=metrics_interval_s)  # fmt: skip
        for url, page in self.pages.pages.items():
            self.lanes[url].page = page
        self.stats = WorkerStats()
        self._rows = row_builder or default_row_builder(config.rows)
        self._probe_stop = asyncio.Event()
        self._background: list[asyncio.Task[None]] = []

    def _router(
        self, config: WorkerConfig, probe: ProbeFn, clock: Callable[[], float]
    ) -> EndpointRouter:
        """The router of ``config``'s endpoints, each limited to its lane's starting limit."""
        routing = config.routing
        router = EndpointRouter(config.endpoints, failure_threshold=routing.failure_threshold,
                                probe_interval_s=routing.probe_interval_s, probe=probe,
                                clock=clock)  # fmt: skip
        for url, lane in self.lanes.items():
            router.set_limit(url, lane.limit.current)
        return router

    def _ensure_background(self) -> None:
        """Start the probes, the stall watch and the pages' pollers (first sample only)."""
        if self._background:
            return
        loop = asyncio.get_running_loop()
        self._background = [loop.create_task(self.router.run_probes(self._probe_stop)),
                            loop.create_task(self.watch.run(self._probe_stop))]  # fmt: skip
        self.pages.start(self.read_server)

    def read_server(self, url: str) -> float | None:
        """The latest reading of ``url``'s page: to the router, and to the endpoint's limit.
        Returns the seconds to the next reading while the server's queue paces the limit's
        growth (regen.engine.pages.Page.pace), None otherwise (the poller's interval)."""
        self.pages.got(url)
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
        if not page.fresh(load):  # a failed round: that reading was followed
            return None
        before = ctl.current
        new = page.follow(ctl, load, self._clock(), self.router.in_flight(url),
                          self.slots.waiting > 0)  # fmt: skip
        if new is not None:
            self.router.set_limit(url, new)
            self.slots.resize(self._capacity())
        return page.pace(ctl.paced, grew=new is not None and new > before)

    async def _attempt(
        self, out: SampleOutcome, messages: Request, tools: Tools | None, seed: int | None
    ) -> TurnResult:
        """One try of one request: a lease on an endpoint, the request, its signals."""
        st, sample_id = self.stats, out.sample_id
        async with self.router.lease(sample_id) as lease:
            url = lease.url
            st.sent += 1
            out.requests += 1
            st.in_flight += 1
            t0 = time.monotonic()
            try:
                async with self.watch.watch(url) as beat:
                    res = await self.lanes[url].client.complete_once(
                        messages, tools, sample_id=sample_id, seed=seed, beat=beat
                    )
            except StallError:  # its retry goes to another endpoint while one is up
                self.router.avoid(sample_id, url)
                raise
            except OverloadedError as e:  # 503 (SGLang) or 429: back off, never "down";
                self.router.avoid(sample_id, url)  # its retry goes elsewhere
                limited = isinstance(e, RateLimitedError)
                self.lanes[url].limit.record_throttled(self._clock(), rate_limited=limited)
                self._adapt(url)
                raise
            finally:
                st.in_flight -= 1
            st.answered(url, time.monotonic() - t0, res)
            self.lanes[url].limit.record(self._clock(), res.completion_tokens or 0, res.ttft_s)
            self._adapt(url)
            return res

    async def _complete(
        self, out: SampleOutcome, messages: Request, tools: Tools | None, seed: int | None
    ) -> TurnResult:
        """One turn: each try leases an endpoint; transient failures retried per the policy.
        ``seed`` replaces the sampling seed (a new attempt, regen.plan.attempts)."""
        st = self.stats

        async def attempt(n: int) -> TurnResult:
            return await self._attempt(out, messages, tools, seed)

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
        return capacity(self.lanes, self.concurrency)

    async def process(self, sample: Sample) -> SampleOutcome:
        """All turns of one sample, then its rows; failures become an outcome, not an error."""
        self._ensure_background()
        await self.pages.first_readings()
        out = SampleOutcome(sample.id, sample.source)
        try:
            await self._turns(sample, out)
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

    async def _turns(self, sample: Sample, out: SampleOutcome) -> None:
        """The sample's requests (holding one slot), then its rows (off the event loop)."""
        if await self.slots.acquire():
            for lane in self.lanes.values():
                lane.limit.note_demand()
        seed = attempt_seed(self.config.seed, sample.attempt)
        try:
            conv = await regenerate(
                sample, lambda msgs, tools: self._complete(out, msgs, tools, seed)
            )
        finally:
            self.slots.release()
        out.rows = await asyncio.to_thread(self._rows, sample, conv.turns)
        if conv.ended is not None and out.rows:  # why the conversation stopped early
            out.rows[-1]["ended"] = conv.ended

    def snapshot(self) -> WorkerSnapshot:
        """Counters and per-endpoint state, as plain data for the driver."""
        st = self.stats
        errors: dict[str, ErrorSnapshot] = {
            k: {"count": v.count, "message": v.last_message, "at": v.last_at}
            for k, v in st.errors.items()
        }
        return {
            "in_flight": st.in_flight,
            "sent": st.sent,
            "ok": st.ok,
            "retried": st.retried,
            "failed": st.failed,
            "errors": errors,
            "endpoints": self.router.snapshot(),
            "latencies": {u: list(v[-64:]) for u, v in st.latencies.items()},
            "cache": {u: list(v) for u, v in st.cache.items()},
            "slots": self.slots.capacity,
            "limits": {u: lane.limit.current for u, lane in self.lanes.items()},
        }

    async def aclose(self) -> None:
        self._probe_stop.set()
        for bg in self._background:
            bg.cancel()
        await self.watch.aclose()
        await self.pages.aclose()
        for lane in self.lanes.values():
            try:
                await lane.client.aclose()
            except Exception as e:  # closing is best effort
                log.debug("closing client: %s", e)
