"""A server's own metrics: its Prometheus ``/metrics`` page, parsed and read as its load.

SGLang (with ``--enable-metrics``) and vLLM serve Prometheus text at ``/metrics``; each engine
profile names the series that say how loaded the server is (:class:`MetricNames`, in
:mod:`regen.client.profiles`). The page is parsed with ``prometheus_client``'s text parser,
never by hand:

- :func:`parse_page` reads a whole page; a page the parser refuses (cut mid-line, an HTML
  error page, garbage) is a :class:`MetricsPageError`, never half a reading;
- :func:`parse_metrics` is the tolerant reading of :func:`parse_page` for the identity and
  speculation checks: a damaged page gives the samples of its lines that parse;
- :func:`read_load` turns one page into a :class:`ServerLoad` (running and queued requests,
  KV-cache usage, generation throughput, aborted and refused requests, speculative
  acceptance), throughput and acceptance over the time since the previous reading when one
  is given;
- :func:`scrape` fetches and reads one endpoint's page within a bounded timeout and returns a
  :class:`Scrape`: its load, or why there is none (unreachable, a status, a damaged page, no
  series of the engine). A failed scrape is reported, never raised: a server's metrics are
  advice, and the run goes on without them.

Series are combined over their label sets as the engines write them: data-parallel ranks
(SGLang's ``dp_rank``, vLLM's ``engine``) add up; only SGLang's stats-logging rank is read
when several tensor-parallel ranks report (the lowest ``tp_rank``); SGLang's priority
breakdown (``priority="<n>"``) is skipped in favour of its total (``priority=""``); fractions
(KV-cache usage) take the fullest rank. Owns no files.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

from regen.client.http import TextGetter
from regen.core.errors import MetricsPageError
from regen.manifest import public_url

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)

#: seconds one scrape may take, connection and body together
SCRAPE_TIMEOUT_S = 2.0
#: seconds between two scrapes of one endpoint (SGLang logs its gauges every few seconds too)
SCRAPE_INTERVAL_S = 5.0
#: a reading older than this many scrape intervals is no longer the server's state
STALE_INTERVALS = 3
#: seconds to the next round when a consumer asks for one soon (a start being paced), doubled
#: while the rounds it asks for find nothing new
SOON_S = 0.1


@dataclass(slots=True, frozen=True)
class MetricSample:
    """One sample line: its exposed name (``vllm:prompt_tokens_total``), value and labels."""

    name: str
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class MetricFamily:
    """One metric as the page declares it: name (counters without ``_total``), type."""

    name: str
    type: str  #: counter, gauge, histogram, summary, unknown, ...
    labels: frozenset[str]  #: label names of its samples (``le``/``quantile`` left out)
    samples: int = 0  #: its sample lines (0: declared, no series yet)


@dataclass(slots=True)
class MetricsPage:
    """A parsed page: every sample and every family."""

    samples: list[MetricSample]
    families: dict[str, MetricFamily]


def parse_page(text: str) -> MetricsPage:
    """Every family and sample of a Prometheus text page; :class:`MetricsPageError` when the
    parser refuses any of it."""
    samples: list[MetricSample] = []
    families: dict[str, MetricFamily] = {}
    try:
        for fam in text_string_to_metric_families(text):
            names: set[str] = set()
            for s in fam.samples:
                samples.append(MetricSample(s.name, float(s.value), dict(s.labels)))
                names.update(k for k in s.labels if k not in ("le", "quantile"))
            families[fam.name] = MetricFamily(
                fam.name, fam.type, frozenset(names), len(fam.samples)
            )
    except ValueError as e:  # the parser's only complaint: a line that is not the format
        raise MetricsPageError(f"not Prometheus text: {e}") from None
    return MetricsPage(samples, families)


def parse_metrics(text: str) -> list[MetricSample]:
    """The samples of a page; a page the parser refuses gives those of its lines that parse
    (each sample line read alone), so one bad line hides only itself."""
    try:
        return parse_page(text).samples
    except MetricsPageError:
        pass
    out: list[MetricSample] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            out += parse_page(line + "\n").samples
        except MetricsPageError:
            continue
    return out


def counter_total(samples: Iterable[MetricSample], name: str, **labels: str) -> float | None:
    """The sum of ``name`` over its series whose labels include ``labels`` (None: no series).

    ``name`` is the sample's exposed name (``vllm:spec_decode_num_drafts_total``)."""
    total = None
    for s in samples:
        matches = s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        if matches and math.isfinite(s.value):
            total = (total or 0.0) + s.value
    return total


def label_values(samples: Iterable[MetricSample], name: str, label: str) -> set[str]:
    """The values ``label`` takes on the series of ``name``."""
    return {s.labels[label] for s in samples if s.name == name and label in s.labels}


def has_prefix(samples: Iterable[MetricSample], prefix: str) -> bool:
    """Whether any sample's name starts with ``prefix`` (``vllm:``: a vLLM server)."""
    return any(s.name.startswith(prefix) for s in samples)


def _rank_series(samples: Iterable[MetricSample], name: str) -> list[float]:
    """One value per data-parallel rank of the gauge ``name`` (see the module docstring)."""
    best: dict[tuple[tuple[str, str], ...], tuple[int, float]] = {}
    for s in samples:
        if s.name != name or s.labels.get("priority", "") != "" or not math.isfinite(s.value):
            continue
        rank = s.labels.get("tp_rank", "0")
        tp = int(rank) if rank.isdigit() else 0
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "tp_rank"))
        if key not in best or tp < best[key][0]:
            best[key] = (tp, s.value)
    return [v for _, v in best.values()]


def gauge_sum(samples: Iterable[MetricSample], name: str) -> float | None:
    """A count gauge over the server (running requests, queued requests): its ranks added."""
    values = _rank_series(samples, name)
    return sum(values) if values else None


def gauge_max(samples: Iterable[MetricSample], name: str) -> float | None:
    """A fraction gauge over the server (KV-cache usage): its fullest rank."""
    values = _rank_series(samples, name)
    return max(values) if values else None


@dataclass(slots=True, frozen=True)
class MetricNames:
    """Where one engine's page says how loaded the server is (exposed sample names).

    A profile without these (``None``) has no page regen reads."""

    prefix: str  #: every name of the engine starts with it
    running: str  #: gauge: requests in the batch
    queued: str  #: gauge: requests waiting to be scheduled
    kv_usage: str  #: gauge: fraction of the KV cache in use, 0 to 1
    generation_tokens: str  #: counter: output tokens
    prompt_tokens: str  #: counter: prompt tokens
    #: gauge: the server's own output tok/s (None: derived from ``generation_tokens``)
    gen_throughput: str | None = None
    aborted: str | None = None  #: counter: requests aborted
    #: labels that select aborted requests from ``aborted`` (vLLM: a finished reason)
    aborted_labels: Mapping[str, str] = field(default_factory=dict)
    refused: str | None = None  #: counter: requests refused at admission (a full queue)
    spec_accept_length: str | None = None  #: gauge: tokens kept per verify step
    spec_drafts: str | None = None  #: counter: verify steps with a draft
    spec_accepted: str | None = None  #: counter: draft tokens accepted

    def names(self) -> tuple[str, ...]:
        """Every exposed name read (for checks against what the engine's code writes)."""
        all_ = (self.running, self.queued, self.kv_usage, self.generation_tokens,
                self.prompt_tokens, self.gen_throughput, self.aborted, self.refused,
                self.spec_accept_length, self.spec_drafts, self.spec_accepted)  # fmt: skip
        return tuple(n for n in all_ if n is not None)


@dataclass(slots=True, frozen=True)
class ServerLoad:
    """What one page said of the server, all clients' traffic included."""

    at: float  #: time.monotonic() of the reading
    running: float | None = None
    queued: float | None = None
    kv_usage: float | None = None  #: 0 to 1
    #: output tok/s: the server's gauge, else over the time since the previous reading
    gen_throughput: float | None = None
    generation_tokens: float | None = None  #: since the server started
    prompt_tokens: float | None = None
    aborted: float | None = None
    refused: float | None = None
    #: tokens kept per verify step (a speculative server): the server's gauge, else from its
    #: counters since the previous reading (since start without one)
    spec_accept_length: float | None = None
    spec_drafts: float | None = None
    spec_accepted: float | None = None

    @property
    def load(self) -> float | None:
        """Requests the server holds, running and queued (None: it said neither)."""
        if self.running is None and self.queued is None:
            return None
        return (self.running or 0.0) + (self.queued or 0.0)

    def to_dict(self) -> dict[str, float | None]:
        return {f: getattr(self, f) for f in self.__slots__ if f != "at"}


def _rate(now: float | None, before: float | None, dt: float) -> float | None:
    if now is None or before is None or dt <= 0 or now < before:  # a restart resets counters
        return None
    return (now - before) / dt


def _accept_length(
    drafts: float | None, accepted: float | None, previous: ServerLoad | None
) -> float | None:
    if drafts is None or accepted is None:
        return None
    if (
        previous is not None
        and previous.spec_drafts is not None
        and previous.spec_accepted is not None
    ):
        d, a = drafts - previous.spec_drafts, accepted - previous.spec_accepted
        if d > 0 and a >= 0:
            return 1.0 + a / d
        if d == 0:
            return previous.spec_accept_length
    return 1.0 + accepted / drafts if drafts > 0 else None


def read_load(
    samples: list[MetricSample],
    names: MetricNames,
    at: float,
    previous: ServerLoad | None = None,
) -> ServerLoad:
    """The load one page's samples describe (``previous``: the last reading of this server,
    for throughput and acceptance over the time between)."""
    gen = counter_total(samples, names.generation_tokens)
    throughput = gauge_sum(samples, names.gen_throughput) if names.gen_throughput else None
    if throughput is None and previous is not None:
        throughput = _rate(gen, previous.generation_tokens, at - previous.at)
    drafts = counter_total(samples, names.spec_drafts) if names.spec_drafts else None
    accepted = counter_total(samples, names.spec_accepted) if names.spec_accepted else None
    accept = gauge_max(samples, names.spec_accept_length) if names.spec_accept_length else None
    if accept is None:
        accept = _accept_length(drafts, accepted, previous)
    aborted = (
        counter_total(samples, names.aborted, **dict(names.aborted_labels))
        if names.aborted
        else None
    )
    return ServerLoad(
        at=at,
        running=gauge_sum(samples, names.running),
        queued=gauge_sum(samples, names.queued),
        kv_usage=gauge_max(samples, names.kv_usage),
        gen_throughput=throughput,
        generation_tokens=gen,
        prompt_tokens=counter_total(samples, names.prompt_tokens),
        aborted=aborted,
        refused=counter_total(samples, names.refused) if names.refused else None,
        spec_accept_length=accept,
        spec_drafts=drafts,
        spec_accepted=accepted,
    )


@dataclass(slots=True, frozen=True)
class Scrape:
    """One attempt to read an endpoint's page: its load, or why there is none."""

    url: str  #: the page's URL
    load: ServerLoad | None = None
    error: str | None = None  #: why no load (None: read)
    status: int | None = None  #: the HTTP status when one came back

    @property
    def ok(self) -> bool:
        return self.load is not None

    @property
    def absent(self) -> bool:
        """The server has no page: 404 (SGLang without ``--enable-metrics``, a plain server)."""
        return self.status == 404


def metrics_url(root: str) -> str:
    """The page of a server root (``http://h:p`` → ``http://h:p/metrics``)."""
    return root.rstrip("/") + "/metrics"


@dataclass(slots=True, frozen=True)
class Page:
    """One answer to a page request: status and body."""

    status_code: int
    text: str


class PageClient:
    """The HTTP client of the pollers: one aiohttp session (made on first use, on the running
    loop), with the one call a scrape makes (``get``, as an ``httpx2.AsyncClient`` has it)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def get(self, url: str, headers: Mapping[str, str] | None = None) -> Page:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        async with self._session.get(url, headers=dict(headers or {})) as resp:
            return Page(resp.status, await resp.text(errors="replace"))

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


async def _fetch(http: TextGetter, url: str, headers: Mapping[str, str]) -> tuple[int, str]:
    resp = await http.get(url, headers=dict(headers))
    return resp.status_code, resp.text


async def scrape(
    http: TextGetter,
    root: str,
    names: MetricNames,
    headers: Mapping[str, str] | None = None,
    *,
    previous: ServerLoad | None = None,
    timeout_s: float = SCRAPE_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
) -> Scrape:
    """Read the page of the server at ``root`` (an ``httpx2.AsyncClient``-like ``http``),
    within ``timeout_s``; never raises for anything the server or the network does."""
    url = metrics_url(root)
    try:
        status, text = await asyncio.wait_for(_fetch(http, url, headers or {}), timeout_s)
    except TimeoutError:
        return Scrape(url, error=f"no answer in {timeout_s:g} s")
    except Exception as e:  # unreachable, refused, reset: the network's answer, reported
        return Scrape(url, error=f"unreachable: {type(e).__name__}: {e}".rstrip(": "))
    if status != 200:
        return Scrape(url, error=f"HTTP {status}", status=status)
    try:
        page = parse_page(text)
    except MetricsPageError as e:
        return Scrape(url, error=f"damaged page: {e}", status=status)
    if not has_prefix(page.samples, names.prefix):
        return Scrape(url, error=f"no {names.prefix} series on the page", status=status)
    return Scrape(url, load=read_load(page.samples, names, clock(), previous), status=status)


class MetricsPoller:
    """One endpoint's page, read every ``interval_s`` off the request path.

    :meth:`run` loops until cancelled; :meth:`poll` is one round. :attr:`latest` is the last
    good reading while it is fresh (younger than ``STALE_INTERVALS`` intervals), else None:
    a consumer then falls back to what it does without metrics. The state is said once per
    change (``on_change(url, message)``; by default a log line): the first reading, a page
    that is absent (said once; the server is asked again every ``absent_every`` rounds, in
    case metrics are switched on), a failure, a recovery.
    """

    def __init__(
        self,
        http: TextGetter,
        root: str,
        names: MetricNames,
        headers: Mapping[str, str] | None = None,
        *,
        interval_s: float = SCRAPE_INTERVAL_S,
        timeout_s: float = SCRAPE_TIMEOUT_S,
        absent_every: int = 12,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str, str], None] | None = None,
    ) -> None:
        self.http, self.root, self.names = http, root, names
        self.headers = dict(headers or {})
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.absent_every = max(1, absent_every)
        self.clock = clock
        self.on_change = on_change or _log_change
        self.last: Scrape | None = None  #: the latest attempt, good or not
        self._good: ServerLoad | None = None
        self._said: str | None = None
        self._rounds = 0
        self.scrapes = 0  #: attempts made
        self.took_s = 0.0  #: seconds the last attempt took (the page's round trip)
        self.failures = 0  #: attempts that gave no reading

    @property
    def latest(self) -> ServerLoad | None:
        good = self._good
        if good is None or self.clock() - good.at > STALE_INTERVALS * self.interval_s:
            return None
        return good

    @property
    def absent(self) -> bool:
        return self.last is not None and self.last.absent

    async def poll(self) -> Scrape | None:
        """One round (skipped, returning None, on the rounds an absent page is not asked)."""
        self._rounds += 1
        if self.absent and self._rounds % self.absent_every:
            return None
        started = time.monotonic()
        got = await scrape(self.http, self.root, self.names, self.headers, previous=self._good,
                           timeout_s=self.timeout_s, clock=self.clock)  # fmt: skip
        self.took_s = time.monotonic() - started
        self.scrapes += 1
        self.last = got
        if got.load is not None:
            self._good = got.load
        else:
            self.failures += 1
        self._say(got)
        return got

    def _say(self, got: Scrape) -> None:
        state = "ok" if got.ok else "absent" if got.absent else "failed"
        if state == self._said:
            return
        self._said = state
        shown = public_url(got.url)  # messages never carry user:password
        if got.ok:
            message = f"reading {shown}"
        elif got.absent:
            message = f"{shown}: no metrics page (HTTP 404): scheduling without it"
        else:
            message = f"{shown}: {got.error}: scheduling without it"
        self.on_change(self.root, message)

    async def run(self, after: Callable[[], float | None] | None = None) -> None:
        """Poll every ``interval_s`` until cancelled (a round's own time counts in it);
        ``after()`` is called after each round (a consumer reading :attr:`latest`); it may
        return the seconds to the next round, at most ``interval_s`` (None: ``interval_s``)."""
        me = asyncio.current_task()
        while True:
            started = self.clock()
            await self.poll()
            if me is not None and me.cancelling():  # a cancel wait_for swallowed (3.11)
                raise asyncio.CancelledError
            asked = after() if after is not None else None
            wait = self.interval_s if asked is None else min(self.interval_s, asked)
            await asyncio.sleep(max(0.0, wait - (self.clock() - started)))


def _log_change(root: str, message: str) -> None:
    log.info("%s", message)
