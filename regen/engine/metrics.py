"""regen's own metrics, where operators look: Ray's metrics export, or a page of its own.

While a run goes, :class:`RunMetrics` reads the run directory the way ``regen status`` does
(:class:`regen.status.RunView`: the same numbers, so a PromQL query over these metrics and
``regen status --json`` agree) every ``every_s`` seconds in a thread of the driver, and
publishes them:

- through ``ray.util.metrics`` whenever this process is connected to Ray (the driver is): Ray's
  metrics agent serves them to Prometheus beside Ray's own, each name prefixed ``ray_`` by Ray
  and each counter suffixed ``_total`` (``regen_tokens_out`` is scraped as
  ``ray_regen_tokens_out_total``), with Ray's labels (``SessionName``, ``NodeAddress``, ...)
  added;
- on ``127.0.0.1:PORT/metrics`` when asked (``regen run --metrics-port PORT``: a run without
  a Ray cluster's export), under the exact names Ray exports, so one dashboard
  (``grafana/regen.json``) and one set of alerts serve both.

The metrics (:data:`METRICS`; docs/metrics.md has the table): samples planned, done, failed
and left per ``source``; completion tokens, loops cut while streaming and the tokens those
cuts spared per ``source``; the run's requests per
``outcome`` and errors per ``kind``; per ``endpoint`` the requests in flight, whether it is in
rotation, its answers and median latency, and the server's own running and queued requests and
KV-cache usage as regen last read its ``/metrics``, and its prefix cache (prompt tokens of the
answers that reported it, cached tokens, their ratio); the ETA; the time tokens last grew; the run's
state. Counters are the run directory's running totals (all sessions), so a resumed run's
counters go on from where they were; Ray's are fed the differences. Owns no files (it only
reads the run directory).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from regen.core.errors import RegenError
from regen.status import RunView
from regen.store.rundir import RunDir

if TYPE_CHECKING:
    from regen.status import RunNumbers

log = logging.getLogger(__name__)

#: seconds between two publications (Ray exports every few seconds; Prometheus scrapes 15-60)
PUBLISH_EVERY_S = 5.0
#: the prefix Ray puts before every application metric it exports
RAY_PREFIX = "ray_"
#: the states a run can be in (regen.status), one gauge series each
STATES = ("empty", "starting", "running", "stalled", "dead", "finished", "interrupted", "failed")


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric: its name as given to ``ray.util.metrics``, kind, help and label names."""

    name: str
    kind: Literal["counter", "gauge"]
    help: str
    labels: tuple[str, ...] = ()

    @property
    def exported(self) -> str:
        """The name Prometheus scrapes (Ray's prefix; a counter's ``_total``)."""
        return RAY_PREFIX + self.name + ("_total" if self.kind == "counter" else "")


METRICS: tuple[Metric, ...] = (
    Metric("regen_samples_planned", "gauge", "Samples the plan holds.", ("source",)),
    Metric("regen_samples_done", "gauge", "Samples whose rows are stored.", ("source",)),
    Metric("regen_samples_failed", "gauge", "Permanent failures on record.", ("source",)),
    Metric("regen_samples_left", "gauge", "Samples still to do.", ("source",)),
    Metric("regen_tokens_out", "counter", "Completion tokens stored.", ("source",)),
    Metric(
        "regen_loops_cut",
        "counter",
        "Answers regen cut while they streamed because they looped (quality.loop_cut).",
        ("source",),
    ),
    Metric(
        "regen_loop_tokens_spared",
        "counter",
        "Tokens the loop cuts spared the servers (max_tokens less what was streamed).",
        ("source",),
    ),
    Metric(
        "regen_requests",
        "counter",
        "Requests of the run by outcome (sent, ok, retried, failed).",
        ("outcome",),
    ),
    Metric("regen_errors", "counter", "Request errors by class.", ("kind",)),
    Metric("regen_requests_in_flight", "gauge", "Requests in flight.", ("endpoint",)),
    Metric("regen_endpoint_up", "gauge", "1 while the endpoint is in rotation.", ("endpoint",)),
    Metric(
        "regen_endpoint_stalled",
        "gauge",
        "1 while the endpoint is out of rotation because its streams stalled.",
        ("endpoint",),
    ),
    Metric(
        "regen_endpoint_answers",
        "counter",
        "Answers of the endpoint (the whole run) by outcome (ok, error).",
        ("endpoint", "outcome"),
    ),
    Metric("regen_endpoint_latency_p50_seconds", "gauge", "Median request latency.", ("endpoint",)),
    Metric(
        "regen_endpoint_server_running",
        "gauge",
        "Requests the server runs, every client's (its /metrics, as regen last read it).",
        ("endpoint",),
    ),
    Metric(
        "regen_endpoint_server_queued",
        "gauge",
        "Requests waiting in the server, every client's (its /metrics, as regen last read it).",
        ("endpoint",),
    ),
    Metric(
        "regen_endpoint_server_kv_usage",
        "gauge",
        "The server's KV-cache usage, 0 to 1 (its /metrics, as regen last read it).",
        ("endpoint",),
    ),
    Metric(
        "regen_endpoint_prompt_tokens",
        "counter",
        "Prompt tokens of the endpoint's answers whose server reported its prefix cache.",
        ("endpoint",),
    ),
    Metric(
        "regen_endpoint_cached_tokens",
        "counter",
        "Of those, the prompt tokens the server found in its prefix cache (cached_tokens).",
        ("endpoint",),
    ),
    Metric(
        "regen_endpoint_cache_hit_rate",
        "gauge",
        "Cached over prompt tokens of the endpoint's answers, the whole run, 0 to 1.",
        ("endpoint",),
    ),
    Metric("regen_eta_seconds", "gauge", "Estimated seconds to the end of the run."),
    Metric(
        "regen_last_progress_timestamp_seconds", "gauge", "Unix time completion tokens last grew."
    ),
    Metric("regen_run_state", "gauge", "1 for the run's state (regen status).", ("state",)),
)
BY_NAME = {m.name: m for m in METRICS}

#: (labels, value) series of one metric
Series = list[tuple[dict[str, str], float]]


def values(n: RunNumbers) -> dict[str, Series]:
    """Every metric's series from one reading of the run's numbers."""
    out: dict[str, Series] = {m.name: [] for m in METRICS}
    for s in n.sources:
        tag = {"source": s.name}
        out["regen_samples_planned"].append((tag, s.total))
        out["regen_samples_done"].append((tag, s.done))
        out["regen_samples_failed"].append((tag, s.failed))
        out["regen_samples_left"].append((tag, s.remaining))
        out["regen_tokens_out"].append((tag, s.completion_tokens))
        out["regen_loops_cut"].append((tag, s.loop_cut))
        out["regen_loop_tokens_spared"].append((tag, s.cut_saved))
    for outcome, count in n.requests.items():
        out["regen_requests"].append(({"outcome": outcome}, count))
    for e in n.errors:
        out["regen_errors"].append(({"kind": e.kind}, e.count))
    for ep in n.endpoints:
        tag = {"endpoint": ep.url}
        out["regen_requests_in_flight"].append((tag, ep.in_flight))
        if ep.healthy is not None:
            out["regen_endpoint_up"].append((tag, 1.0 if ep.healthy else 0.0))
            out["regen_endpoint_stalled"].append((tag, 1.0 if ep.health == "stalled" else 0.0))
        out["regen_endpoint_answers"].append(({**tag, "outcome": "ok"}, ep.ok))
        out["regen_endpoint_answers"].append(({**tag, "outcome": "error"}, ep.errors))
        if ep.latency_p50_s is not None:
            out["regen_endpoint_latency_p50_seconds"].append((tag, ep.latency_p50_s))
        for name, value in (("regen_endpoint_server_running", ep.server_running),
                            ("regen_endpoint_server_queued", ep.server_queued),
                            ("regen_endpoint_server_kv_usage", ep.server_kv_usage)):  # fmt: skip
            if value is not None:
                out[name].append((tag, value))
        out["regen_endpoint_prompt_tokens"].append((tag, ep.cache_prompt_tokens))
        out["regen_endpoint_cached_tokens"].append((tag, ep.cached_tokens))
        if ep.cache_hit_rate is not None:
            out["regen_endpoint_cache_hit_rate"].append((tag, ep.cache_hit_rate))
    if n.eta is not None:
        out["regen_eta_seconds"].append(({}, n.eta.seconds))
    if n.last_progress_at is not None:
        out["regen_last_progress_timestamp_seconds"].append(({}, n.last_progress_at))
    for state in STATES:
        out["regen_run_state"].append(({"state": state}, 1.0 if n.state == state else 0.0))
    return out


class RayMetrics:
    """The series through ``ray.util.metrics`` (made once this process is connected)."""

    def __init__(self) -> None:
        self._made: dict[str, Any] = {}
        self._sent: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def publish(self, series: dict[str, Series]) -> bool:
        """Set the gauges, add to the counters; False when Ray is not connected here."""
        import ray

        if not ray.is_initialized():
            return False
        if not self._made:
            from ray.util.metrics import Counter, Gauge

            for m in METRICS:
                kind = Counter if m.kind == "counter" else Gauge
                self._made[m.name] = kind(m.name, description=m.help, tag_keys=m.labels)
        for name, points in series.items():
            metric, counter = self._made[name], BY_NAME[name].kind == "counter"
            for tags, value in points:
                if counter:
                    key = (name, tuple(sorted(tags.items())))
                    before = self._sent.get(key, 0.0)
                    step = value - before if value >= before else value  # a reset: anew
                    self._sent[key] = value
                    if step > 0:
                        metric.inc(step, tags=tags)
                else:
                    metric.set(value, tags=tags)
        return True


class MetricsServer:
    """``127.0.0.1:PORT/metrics``: the latest series under Ray's exported names."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self.registry = CollectorRegistry(auto_describe=False)
        self.latest: dict[str, Series] = {}
        self.registry.register(self)
        self.server, self.thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = self.server.server_port

    def publish(self, series: dict[str, Series]) -> None:
        self.latest = series

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for name, points in self.latest.items():
            m = BY_NAME[name]
            family = CounterMetricFamily if m.kind == "counter" else GaugeMetricFamily
            fam = family(RAY_PREFIX + m.name, m.help, labels=list(m.labels))
            for tags, value in points:
                fam.add_metric([tags[k] for k in m.labels], float(value))
            yield fam

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RunMetrics:
    """Publishes a run's numbers every ``every_s`` from a thread, until :meth:`stop`.

    ``port`` (None: no page of its own) serves them on 127.0.0.1 too; 0 picks a free port
    (:attr:`port` says which)."""

    def __init__(
        self, run_dir: RunDir | str, *, port: int | None = None, every_s: float = PUBLISH_EVERY_S
    ) -> None:
        self.run_dir, self.every_s = run_dir, every_s
        self.ray = RayMetrics()
        self.page = MetricsServer(port) if port is not None else None
        self.port = self.page.port if self.page is not None else None
        self.published = 0  #: publications made
        self._view: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._said_error = False

    def publish_once(self) -> bool:
        """Read the run directory and publish; False while it cannot be read yet (a run that
        is starting) or on an error (said once, never raised: metrics are advice)."""

        try:
            if self._view is None:
                self._view = RunView(self.run_dir)
            series = values(self._view.numbers())
        except RegenError as e:  # not a run directory yet, or unreadable for now
            self._say(e)
            return False
        except OSError as e:  # the filesystem / object store said no this time
            self._say(e)
            return False
        if self.page is not None:
            self.page.publish(series)
        self.ray.publish(series)
        self.published += 1
        return True

    def _say(self, e: Exception) -> None:
        if not self._said_error:
            log.info("metrics: cannot read %s yet (%s); publishing when it can be", self.run_dir, e)
            self._said_error = True

    def start(self) -> RunMetrics:
        self._thread = threading.Thread(target=self._loop, name="regen-metrics", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            ok = self.publish_once()  # until the run directory exists, asked every second
            if self._stop.wait(self.every_s if ok else min(1.0, self.every_s)):
                return

    def stop(self) -> None:
        """A last publication (the run's final numbers), then the thread and page stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.publish_once()
        if self.page is not None:
            self.page.close()


def start_run_metrics(run_dir: RunDir | str, port: int | None = None) -> RunMetrics:
    """Start publishing ``run_dir``'s numbers (the CLI's one call)."""
    metrics = RunMetrics(run_dir, port=port).start()
    if metrics.port is not None:
        log.info("regen metrics on http://127.0.0.1:%d/metrics", metrics.port)
    return metrics
