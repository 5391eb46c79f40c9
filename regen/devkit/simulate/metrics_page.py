"""The simulated server's ``/metrics`` page, as SGLang 0.5.23 or vLLM 0.32 write theirs.

Both engines build their page with ``prometheus_client``; so does this module, into a registry
of its own per server, with the engines' names, types and label names (tests/contract holds
the SGLang side against the wheel's ``observability/metrics_collector.py``, the vLLM side
against ``v1/metrics/loggers.py`` and a real vLLM's page). What the page reports is the
simulator's real state, every client's traffic included (the background client of
:mod:`regen.devkit.simulate.background` too), read when the page is asked:

==========================  ===============================  ==================================
what                        SGLang                           vLLM
==========================  ===============================  ==================================
requests in the batch       ``sglang:num_running_reqs``      ``vllm:num_requests_running``
requests waiting            ``sglang:num_queue_reqs``        ``vllm:num_requests_waiting``
KV pool in use (0-1)        ``sglang:token_usage``           ``vllm:kv_cache_usage_perc``
KV tokens in use            ``sglang:num_used_tokens``       (none)
output tok/s                ``sglang:gen_throughput``        (none: rate of the counter)
prompt / output tokens      ``sglang:prompt_tokens_total``,  ``vllm:prompt_tokens_total``,
                            ``..generation_tokens_total``    ``vllm:generation_tokens_total``
                            (at finish, by is_streaming)     (prompt at admission, output per
                                                             step)
requests finished           ``sglang:num_requests_total``    ``vllm:request_success_total``
                                                             (by finished_reason)
aborted                     ``..num_aborted_requests_total`` ``finished_reason="abort"``
refused (queue full)        (none)                           ``vllm:admission_rejections_total``
latency histograms          TTFT, end-to-end (is_streaming)  TTFT, end-to-end
speculation                 ``sglang:spec_accept_length``    ``vllm:spec_decode_num_*_total``
prefix cache                ``sglang:cache_hit_rate`` (gauge ``vllm:prefix_cache_queries_total``,
                            over the last 15 s),             ``vllm:prefix_cache_hits_total``,
                            ``sglang:cached_tokens_total``   ``vllm:prompt_tokens_cached_total``
                            (``cache_source="device"``, at   (at admission)
                            finish)
==========================  ===============================  ==================================

Labels as each engine sets them: SGLang's scheduler gauges carry ``model_name``,
``engine_type`` (``unified``), ``tp_rank``, ``pp_rank``, ``moe_ep_rank`` (and ``dp_rank``, one
series per rank, with ``dp_size`` > 1), its tokenizer counters ``model_name`` and
``engine_type``; vLLM's carry ``model_name`` and ``engine``. The KV pool is
``max_total_tokens`` tokens; a request holds its prompt and what it has generated while it
runs. ``gen_throughput`` is the output tok/s over the last seconds.

During a simulated hang (:meth:`SimMetrics.freeze` … :meth:`SimMetrics.thaw`) the scheduler's
gauges (running, waiting, KV use, ``gen_throughput``) keep the values they had when it stopped:
SGLang's scheduler process writes them (``scheduler_components/metrics_reporter.py``, including
the decay of a stale ``gen_throughput`` to 0) and a stuck one writes nothing, while the page
itself is served by the HTTP process. Owns no files.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from regen.devkit.simulate.config import SimConfig
    from regen.devkit.simulate.scheduler import Scheduler
    from regen.devkit.simulate.speculative import SpecServer

#: the page's content type (prometheus_client's text format 0.0.4, as both engines serve)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: SGLang's scheduler labels (their values on a single, non-disaggregated server)
SGLANG_SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
#: SGLang's tokenizer-manager labels
SGLANG_TOKENIZER_LABELS = ("model_name", "engine_type")
#: vLLM's per-engine labels
VLLM_LABELS = ("model_name", "engine")

#: seconds gen_throughput looks back over
THROUGHPUT_WINDOW_S = 5.0

#: seconds sglang:cache_hit_rate looks back over (SGLANG_CACHE_HIT_RATE_WINDOW_SECONDS)
CACHE_HIT_WINDOW_S = 15.0

#: histogram buckets (s) of the latency histograms (the simulator's own choice)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class _HitRate:
    """Cached ÷ looked-up prompt tokens over the last :data:`CACHE_HIT_WINDOW_S`, as SGLang's
    ``_CacheHitRateWindow`` (metrics_reporter.py)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.samples: collections.deque[tuple[float, int, int]] = collections.deque()
        self.hits = self.total = 0

    def add(self, hits: int, total: int) -> None:
        if total > 0:
            self.samples.append((self.clock(), hits, total))
            self.hits += hits
            self.total += total

    def __call__(self) -> float:
        cutoff = self.clock() - CACHE_HIT_WINDOW_S
        while self.samples and self.samples[0][0] <= cutoff:
            _, h, t = self.samples.popleft()
            self.hits -= h
            self.total -= t
        return self.hits / self.total if self.total > 0 else 0.0


class _Throughput:
    """Output tok/s over the last :data:`THROUGHPUT_WINDOW_S` from a monotonic token total."""

    def __init__(self, total: Callable[[], int], clock: Callable[[], float]) -> None:
        self.total, self.clock = total, clock
        self.points: collections.deque[tuple[float, int]] = collections.deque([(clock(), total())])

    def __call__(self) -> float:
        now, tokens = self.clock(), self.total()
        self.points.append((now, tokens))
        while len(self.points) > 2 and now - self.points[1][0] >= THROUGHPUT_WINDOW_S:
            self.points.popleft()
        t0, n0 = self.points[0]
        return (tokens - n0) / (now - t0) if now > t0 else 0.0


class _VllmTokens(Collector):
    """vLLM's output-token counter, counted per step as vLLM does (the scheduler's total)."""

    def __init__(self, labels: list[str], total: Callable[[], int]) -> None:
        self.labels, self.total = labels, total

    def collect(self) -> Iterator[CounterMetricFamily]:
        fam = CounterMetricFamily(
            "vllm:generation_tokens", "Number of generation tokens processed.",
            labels=list(VLLM_LABELS),
        )  # fmt: skip
        fam.add_metric(self.labels, float(self.total()))
        yield fam


class SimMetrics:
    """One server's page: live gauges over the scheduler, counters fed by the server's
    events (:meth:`admitted`, :meth:`finished`, :meth:`aborted`, :meth:`refused`)."""

    def __init__(
        self,
        config: SimConfig,
        scheduler: Scheduler,
        spec: SpecServer | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config, self.scheduler, self.spec = config, scheduler, spec
        self.engine = config.engine
        self.registry = CollectorRegistry(auto_describe=True)
        self._throughput = _Throughput(lambda: scheduler.tokens_total, clock)
        self._hit_rate = _HitRate(clock)
        #: the scheduler's gauges as they stood when a hang began (None: live)
        self.frozen: dict[str, float] | None = None
        if self.engine == "vllm":
            self._vllm()
        else:
            self._sglang()

    # ---- the two pages ---------------------------------------------------------------------

    def _ranks(self) -> list[dict[str, str]]:
        base = {"model_name": self.config.model_name, "engine_type": "unified", "tp_rank": "0",
                "pp_rank": "0", "moe_ep_rank": "0"}  # fmt: skip
        if self.config.dp_size == 1:
            return [base]
        return [base | {"dp_rank": str(i)} for i in range(self.config.dp_size)]

    def _share(self, rank: int, count: Callable[[], float]) -> Callable[[], float]:
        """Rank ``rank``'s share of a server-wide count (the DP ranks split it evenly)."""
        dp = self.config.dp_size

        def value() -> float:
            n = int(count())
            return float(n // dp + (rank < n % dp))

        return value

    def _sglang(self) -> None:
        reg, ranks = self.registry, self._ranks()
        names = list(ranks[0])

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labelnames=names, registry=reg)

        running = gauge("sglang:num_running_reqs", "The number of running requests.")
        queued = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        usage = gauge("sglang:token_usage", "The token usage.")
        used = gauge("sglang:num_used_tokens", "The number of used tokens.")
        tput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        retracted = gauge("sglang:num_retracted_reqs", "The number of retracted requests.")
        hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        accept = None
        if self.spec is not None:
            accept = gauge("sglang:spec_accept_length", "The average acceptance length of "
                           "speculative decoding.")  # fmt: skip
        dp = self.config.dp_size
        for i, labels in enumerate(ranks):
            running.labels(**labels).set_function(self._share(i, self.n_running))
            queued.labels(**labels).set_function(self._share(i, self.n_queued))
            usage.labels(**labels).set_function(self.kv_usage)
            used.labels(**labels).set_function(self._share(i, self.kv_used))
            tput.labels(**labels).set_function(lambda: self.throughput() / dp)
            retracted.labels(**labels).set(0)
            hit_rate.labels(**labels).set_function(self._hit_rate)
            if accept is not None:
                accept.labels(**labels).set_function(self._accept_length)
        tok = list(SGLANG_TOKENIZER_LABELS)
        self.tok_labels = {"model_name": self.config.model_name, "engine_type": "unified"}
        streamed = [*tok, "is_streaming"]
        self.prompt_tokens = Counter("sglang:prompt_tokens_total",
                                     "Number of prefill tokens processed.",
                                     labelnames=streamed, registry=reg)  # fmt: skip
        self.generation_tokens = Counter("sglang:generation_tokens_total",
                                         "Number of generation tokens processed.",
                                         labelnames=streamed, registry=reg)  # fmt: skip
        self.requests = Counter("sglang:num_requests_total", "Number of requests processed.",
                                labelnames=streamed, registry=reg)  # fmt: skip
        self.aborts = Counter("sglang:num_aborted_requests_total", "Number of requests aborted.",
                              labelnames=tok, registry=reg)  # fmt: skip
        self.aborts.labels(**self.tok_labels)
        self.cached_tokens = Counter("sglang:cached_tokens_total",
                                     "Number of cached prompt tokens by source "
                                     "(device/host/storage).",
                                     labelnames=[*tok, "cache_source"], registry=reg)  # fmt: skip
        self.ttft = Histogram("sglang:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.",
                              labelnames=streamed, buckets=TTFT_BUCKETS, registry=reg)  # fmt: skip
        self.e2e = Histogram("sglang:e2e_request_latency_seconds",
                             "Histogram of End-to-end request latency in seconds",
                             labelnames=streamed, buckets=E2E_BUCKETS, registry=reg)  # fmt: skip

    def _vllm(self) -> None:
        reg, sched = self.registry, self.scheduler
        names = list(VLLM_LABELS)
        self.engine_labels = [self.config.model_name, "0"]
        lv = self.engine_labels

        def gauge(name: str, doc: str, value: Callable[[], float]) -> None:
            g = Gauge(name, doc, labelnames=names, registry=reg, multiprocess_mode="mostrecent")
            g.labels(*lv).set_function(value)

        gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
              self.n_running)  # fmt: skip
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
              self.n_queued)  # fmt: skip
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
              self.kv_usage)  # fmt: skip
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                     labelnames=names, registry=reg)  # fmt: skip
        self.prompt_tokens.labels(*lv)
        reg.register(_VllmTokens(lv, lambda: sched.tokens_total))
        self.cache_queries = Counter("vllm:prefix_cache_queries",
                                     "Prefix cache queries, in terms of number of queried "
                                     "tokens.", labelnames=names, registry=reg)  # fmt: skip
        self.cache_hits = Counter("vllm:prefix_cache_hits",
                                  "Prefix cache hits, in terms of number of cached tokens.",
                                  labelnames=names, registry=reg)  # fmt: skip
        self.prompt_cached = Counter("vllm:prompt_tokens_cached",
                                     "Number of cached prompt tokens (local + external).",
                                     labelnames=names, registry=reg)  # fmt: skip
        for counter in (self.cache_queries, self.cache_hits, self.prompt_cached):
            counter.labels(*lv)
        self.success = Counter("vllm:request_success",
                               "Count of successfully processed requests.",
                               labelnames=[*names, "finished_reason"], registry=reg)  # fmt: skip
        for reason in ("stop", "length", "abort", "error", "repetition"):
            self.success.labels(*lv, reason)
        self.rejections = Counter("vllm:admission_rejections",
                                  "Number of admission attempts rejected by a queue limit, by "
                                  "reason.", labelnames=["model_name", "reason"],
                                  registry=reg)  # fmt: skip
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            self.rejections.labels(self.config.model_name, reason)
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.",
                              labelnames=names, buckets=TTFT_BUCKETS, registry=reg)  # fmt: skip
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.",
                             labelnames=names, buckets=E2E_BUCKETS, registry=reg)  # fmt: skip
        self.ttft.labels(*lv)  # vLLM makes each engine's series at start
        self.e2e.labels(*lv)
        if self.spec is not None:
            self._vllm_spec(names, lv)

    def _vllm_spec(self, names: list[str], lv: list[str]) -> None:
        """vLLM's speculative counters, read from the speed model's running totals: a verify
        step per running request is a draft; it proposes the draft length and keeps the
        acceptance length minus the bonus token."""
        assert self.spec is not None
        spec: SpecServer = self.spec  # typed: the collector below reads it later
        k = spec.max_step_tokens - 1
        registry = self.registry

        class _Spec(Collector):
            def collect(self) -> Iterator[CounterMetricFamily]:
                c = spec.counters
                drafts, kept = c.forward_ct, c.accept_tokens
                values = (
                    ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", drafts),
                    ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", drafts * k),
                    ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                     max(0, kept - drafts)),
                )  # fmt: skip
                for name, doc, value in values:
                    fam = CounterMetricFamily(name, doc, labels=names)
                    fam.add_metric(lv, float(value))
                    yield fam
                per_pos = CounterMetricFamily(
                    "vllm:spec_decode_num_accepted_tokens_per_pos",
                    "Accepted tokens per draft position.", labels=[*names, "position"],
                )  # fmt: skip
                for pos in range(k):  # the speed model keeps no per-position counts
                    per_pos.add_metric([*lv, str(pos)], 0.0)
                yield per_pos

        registry.register(_Spec())

    # ---- live values (frozen during a hang) --------------------------------------------------

    def freeze(self) -> None:
        """A hang began: the scheduler's gauges keep their present values until :meth:`thaw`."""
        live = {"running": self.n_running(), "queued": self.n_queued(),
                "kv_used": self.kv_used(), "throughput": self.throughput()}  # fmt: skip
        self.frozen = live

    def thaw(self) -> None:
        self.frozen = None

    def n_running(self) -> float:
        f = self.frozen
        return f["running"] if f is not None else float(self.scheduler.n_running)

    def n_queued(self) -> float:
        f = self.frozen
        return f["queued"] if f is not None else float(self.scheduler.n_queued)

    def throughput(self) -> float:
        """Output tok/s over the last seconds (``gen_throughput``)."""
        f = self.frozen
        return f["throughput"] if f is not None else self._throughput()

    def kv_used(self) -> int:
        """KV tokens held by the requests in the batch (prompt plus what they generated)."""
        if self.frozen is not None:
            return int(self.frozen["kv_used"])
        return sum(j.prompt + j.produced for j in self.scheduler.running if not j.cancelled)

    def kv_usage(self) -> float:
        return min(1.0, self.kv_used() / self.config.kv_tokens)

    def _accept_length(self) -> float:
        spec = self.spec
        avg = spec.counters.avg_accept_length if spec is not None else None
        return float(avg) if avg is not None else 0.0

    # ---- events ----------------------------------------------------------------------------

    def admitted(self, prompt_tokens: int, cached_tokens: int | None = None) -> None:
        """A request entered the server (vLLM counts its prompt when it is scheduled);
        ``cached_tokens``: what the prefix cache held of it (None: no prefix cache)."""
        if cached_tokens is not None:
            self._hit_rate.add(cached_tokens, prompt_tokens)
        if self.engine == "vllm":
            lv = self.engine_labels
            self.prompt_tokens.labels(*lv).inc(prompt_tokens)
            if cached_tokens is not None:
                self.cache_queries.labels(*lv).inc(prompt_tokens)
                self.cache_hits.labels(*lv).inc(cached_tokens)
                self.prompt_cached.labels(*lv).inc(cached_tokens)

    def finished(
        self,
        *,
        stream: bool,
        prompt_tokens: int,
        completion_tokens: int,
        finish_reason: str,
        received_at: float,
        first_token_at: float | None,
        finished_at: float,
        cached_tokens: int = 0,
    ) -> None:
        """A request answered in full."""
        if self.engine == "vllm":
            lv = self.engine_labels
            reason = finish_reason if finish_reason in ("stop", "length", "abort") else "stop"
            self.success.labels(*lv, reason).inc()
            if first_token_at is not None:
                self.ttft.labels(*lv).observe(max(0.0, first_token_at - received_at))
            self.e2e.labels(*lv).observe(max(0.0, finished_at - received_at))
            return
        labels = self.tok_labels | {"is_streaming": "true" if stream else "false"}
        self.prompt_tokens.labels(**labels).inc(prompt_tokens)
        self.generation_tokens.labels(**labels).inc(completion_tokens)
        self.requests.labels(**labels).inc()
        if cached_tokens > 0:
            self.cached_tokens.labels(**self.tok_labels, cache_source="device").inc(cached_tokens)
        if first_token_at is not None:
            self.ttft.labels(**labels).observe(max(0.0, first_token_at - received_at))
        self.e2e.labels(**labels).observe(max(0.0, finished_at - received_at))

    def aborted(self) -> None:
        """A request ended before its answer did (the client hung up, an abort)."""
        if self.engine == "vllm":
            self.success.labels(*self.engine_labels, "abort").inc()
        else:
            self.aborts.labels(**self.tok_labels).inc()

    def refused(self) -> None:
        """A request refused because the queue is full (vLLM counts it; SGLang does not)."""
        if self.engine == "vllm":
            self.rejections.labels(self.config.model_name, "max_num_queued_reqs").inc()

    def render(self) -> bytes:
        """The page, as ``GET /metrics`` answers it."""
        return generate_latest(self.registry)
