"""The driver's counters, published as the run directory's progress file (regen.store.progress).

Source counters start from the verified parts of earlier sessions (the done-set) and the
failures on record, then grow as samples complete; what is journaled but not yet in a part is
also counted as ``pending`` (cleared when the part is written), so a reader can tell the
counters that a part's record backs. Request counters and endpoint views come from the
workers' snapshots; the driver sums them and adds them to what earlier sessions counted
(:meth:`ProgressTracker.carry_over`), so every counter of the file covers the whole run.
"""

from __future__ import annotations

import os
import socket
import statistics
import time

from regen.engine.router import worse
from regen.engine.worker import SampleOutcome, WorkerSnapshot
from regen.manifest import public_url
from regen.store import layout
from regen.store.counts import SourceCounts
from regen.store.doneset import DoneSet
from regen.store.layout import PartRecord
from regen.store.progress import (
    EndpointProgress,
    ErrorInfo,
    ProgressSnapshot,
    RequestCounts,
    SourceProgress,
)
from regen.store.rundir import RunDir
from regen.store.stale import StaleSet, current_counts


class ProgressTracker:
    """Builds the progress snapshot of one session and writes it atomically."""

    def __init__(
        self,
        rd: RunDir,
        *,
        name: str,
        model: str,
        session: str,
        run_started_at: float,
        endpoints: list[str],
    ) -> None:
        now = time.time()
        self.rd = rd
        self.snap = ProgressSnapshot(
            name=name,
            model=model,
            session=session,
            host=socket.gethostname(),
            pid=os.getpid(),
            state="running",
            run_started_at=run_started_at,
            started_at=now,
            updated_at=now,
            endpoints_configured=list(endpoints),
        )
        self.session_tokens = 0
        self._driver_errors: dict[str, ErrorInfo] = {}
        self._worker_errors: dict[str, ErrorInfo] = {}
        #: what earlier sessions counted (:meth:`carry_over`): this session adds to it
        self._base_requests = RequestCounts()
        self._base_errors: dict[str, ErrorInfo] = {}
        self._base_endpoints: dict[str, EndpointProgress] = {}
        self.snap.add_token_point(now, 0, force=True)

    def source(self, name: str) -> SourceProgress:
        return self.snap.sources.setdefault(name, SourceProgress())

    def start_from(
        self,
        done: DoneSet,
        totals: dict[str, tuple[int, bool]],
        failed: dict[str, int],
        retrying: dict[str, int] | None = None,
        stale: StaleSet | None = None,
    ) -> None:
        """Counters of earlier sessions: totals {source: (samples, regenerate)}; ``retrying``:
        the new attempts (regen run --retry-flagged) this session planned per source;
        ``stale``: the stored answers the plan no longer wants (counted apart, not as done)."""
        for name, (total, regen_) in totals.items():
            sp = self.source(name)
            sp.total, sp.regenerate = total, regen_
            sp.failed = failed.get(name, 0)
            sp.retrying = (retrying or {}).get(name, 0)
        for name, t in current_counts(done, stale or StaleSet()).items():
            self.source(name).add(t)
        for name, t in (stale.sources if stale is not None else {}).items():
            self.source(name).stale = t

    def carry_over(self, last: ProgressSnapshot | None) -> None:
        """Start the run-wide counters from the progress file an earlier session left:
        requests, errors, the answers and health as last seen of each endpoint this session is
        given too, the output-length histogram. So `regen status`, `regen monitor` and the
        metrics read the whole run after a resume, never an empty session's counters."""
        if last is None:
            return
        self._base_requests = last.requests.model_copy()
        self._base_errors = {k: v.model_copy() for k, v in last.errors.items()}
        idle = {"in_flight": 0, "server_running": None, "server_queued": None,
                "server_kv_usage": None}  # fmt: skip
        configured = set(self.snap.endpoints_configured)  # an endpoint no longer given is gone
        self._base_endpoints = {e.url: e.model_copy(update=idle) for e in last.endpoints
                                if e.url in configured}  # fmt: skip
        self.snap.requests = self._base_requests.model_copy()
        self.snap.endpoints = [e.model_copy() for e in self._base_endpoints.values()]
        self.snap.errors = self._errors()
        if last.output_tokens_hist.edges:
            self.snap.output_tokens_hist = last.output_tokens_hist.model_copy(deep=True)

    def sample_counted(
        self,
        source: str,
        c: SourceCounts,
        tokens: list[int],
        *,
        was_failed: bool,
        retry: bool,
        supersedes: SourceCounts | None = None,
    ) -> None:
        """One stored sample: its counters (:meth:`regen.store.completed.CompletedSample.counts`:
        a new attempt's, ``retry``, are the difference from the answer it replaces) and the
        completion tokens of its regenerated rows (:func:`regen.store.counts.output_tokens`).
        ``supersedes``: the stale answer a new attempt replaces (not counted as done: the
        sample is done now, and that answer is no longer stale)."""
        sp = self.source(source)
        sp.add(c)
        if supersedes is not None:
            sp.add(supersedes)
            sp.stale.add(supersedes, -1)
        self.session_tokens += sum(tokens)
        if retry:
            sp.retrying = max(0, sp.retrying - 1)
        if was_failed:
            sp.failed = max(0, sp.failed - 1)
        for t in tokens:
            self.snap.output_tokens_hist.add(t)
        if sp.pending is None:
            sp.pending = SourceCounts()
        sp.pending.add(c)

    def part_written(self, record: PartRecord | None) -> None:
        """The journaled samples are in a part now: nothing is pending any more."""
        for sp in self.snap.sources.values():
            sp.pending = SourceCounts()

    def sample_failed(
        self, out: SampleOutcome, *, newly_permanent: bool, retry: bool = False
    ) -> None:
        """A sample that could not be completed; a failed new attempt (``retry``) keeps the
        sample's earlier answer: it only leaves what this session still has to do."""
        if retry:
            sp = self.source(out.source)
            sp.retrying = max(0, sp.retrying - 1)
        elif newly_permanent:
            self.source(out.source).failed += 1

    def driver_error(self, kind: str, message: str) -> None:
        self._driver_errors.setdefault(kind, ErrorInfo()).add(message, time.time())

    def workers(self, snaps: list[WorkerSnapshot]) -> None:
        """Fold the workers' snapshots (requests, errors, endpoints)."""
        if not snaps:
            return
        req = self._base_requests.model_copy()
        errors: dict[str, ErrorInfo] = {}
        eps: dict[str, EndpointProgress] = {}
        lats: dict[str, list[float]] = {}
        in_flight = 0
        for s in snaps:
            in_flight += s["in_flight"]
            req.sent += s["sent"]
            req.ok += s["ok"]
            req.retried += s["retried"]
            req.failed += s["failed"]
            for kind, got in s["errors"].items():
                e = errors.setdefault(kind, ErrorInfo())
                e.count += got["count"]
                if got["at"] >= e.last_at:
                    e.last_message, e.last_at = got["message"], got["at"]
            for url, ep in s["endpoints"].items():
                cur = eps.setdefault(url, EndpointProgress(url=public_url(url), healthy=True))
                cur.in_flight += ep["in_flight"]
                cur.ok += ep["ok"]
                cur.errors += ep["failures"] + ep["throttled"]
                cur.healthy = cur.healthy and ep["state"] == "up"
                cur.health = worse(cur.health, ep["state"])
                cur.stalls += ep.get("stalls", 0)
                server = ep.get("server")  # every worker reads the same page: any reading
                if server and cur.server_running is None and cur.server_queued is None:
                    cur.server_running = server.get("running")
                    cur.server_queued = server.get("queued")
                    cur.server_kv_usage = server.get("kv_usage")
            for url, values in s.get("latencies", {}).items():
                lats.setdefault(url, []).extend(values)
            for url, (prompt, cached) in s.get("cache", {}).items():
                if url in eps:
                    eps[url].cache_prompt_tokens += prompt
                    eps[url].cached_tokens += cached
        for url, values in lats.items():
            if url in eps and values:
                eps[url].latency_p50_s = round(statistics.median(values), 4)
        self.snap.in_flight = in_flight
        self.snap.requests = req
        self._worker_errors = errors
        self.snap.endpoints = self._with_base(list(eps.values()))

    def _with_base(self, session: list[EndpointProgress]) -> list[EndpointProgress]:
        """This session's endpoints with earlier sessions' answers added; an endpoint this
        session has not reported keeps its record as last seen."""
        out = {url: e.model_copy() for url, e in self._base_endpoints.items()}
        for e in session:
            base = out.get(e.url)
            if base is not None:
                e.ok += base.ok
                e.errors += base.errors
                e.cache_prompt_tokens += base.cache_prompt_tokens
                e.cached_tokens += base.cached_tokens
                if e.latency_p50_s is None:
                    e.latency_p50_s = base.latency_p50_s
            out[e.url] = e
        return list(out.values())

    def _errors(self) -> dict[str, ErrorInfo]:
        """Earlier sessions' errors, the workers' and the driver's, per class."""
        merged = {k: v.model_copy() for k, v in self._base_errors.items()}
        for source in (self._worker_errors, self._driver_errors):
            for k, v in source.items():
                e = merged.setdefault(k, ErrorInfo())
                e.count += v.count
                if v.last_at >= e.last_at:
                    e.last_message, e.last_at = v.last_message, v.last_at
        return merged

    def write(self, state: str | None = None) -> None:
        now = time.time()
        if state is not None:
            self.snap.state = state  # type: ignore[assignment]
        self.snap.updated_at = now
        self.snap.add_token_point(now, self.session_tokens, force=state is not None)
        self.snap.errors = self._errors()
        layout.PROGRESS_FILE.write(self.rd, self.snap)
