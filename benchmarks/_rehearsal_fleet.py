"""The rehearsal's SGLang endpoints: ``regen simulate`` processes on fixed loopback ports that
can be killed and started again on the same port, and a poller of their ``/stats`` (issue 32).

Each :class:`Endpoint` runs ``python -m regen simulate --port P`` in a process group of its
own, forked from this process's fork server (``regen.devkit.simulate.testing.launch_simulator``:
the simulator's imports done once); every start is an :class:`Incarnation` with its own request
log (``WORK/sims/ep{i}-{n}.jsonl``) and output (``WORK/sims/ep{i}-{n}.log``), and the monotonic
time its server began counting (the request log's ``t`` is seconds since then; every process
of this machine shares the monotonic clock). :class:`Poller` reads every endpoint's
``/stats`` every ``interval`` seconds in a thread (tokens generated, requests received and
completed, running and queued), so utilization can be cut into windows afterwards; a
restarted server's counters start at zero again, which the readings keep apart by
incarnation. Owns the files named above.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regen.devkit.procs import Process, kill_group, stop_group
from regen.devkit.simulate.testing import launch_simulator, options_to_args, with_tokenizer_class

START_TIMEOUT_S = 120.0  #: a start, from its launch (all of a fleet launch at once)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


@dataclass(slots=True)
class Incarnation:
    """One start of an endpoint's server process."""

    n: int
    pid: int
    log: Path  #: its request log
    launched: float  #: monotonic time of the launch
    started: float = 0.0  #: monotonic time its server began counting (request log t = 0)
    ready: float = 0.0  #: monotonic time it answered /health
    stopped: float | None = None  #: monotonic time it was killed or stopped
    options: dict[str, Any] = field(default_factory=dict)  #: its extra flags


@dataclass
class Endpoint:
    """One simulated SGLang server on a fixed port."""

    index: int
    port: int
    options: dict[str, Any]
    folder: Path
    incarnations: list[Incarnation] = field(default_factory=list)
    proc: Process | None = None
    on_start: Any = None  #: called with the new process's pid (the CPU sampler registers it)
    #: a start launched and not yet answering (:meth:`launch`, :meth:`wait_ready`)
    launching: tuple[Process, Incarnation] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base}/v1"

    @property
    def capacity_tok_s(self) -> float:
        slots = self.options.get("max_running_requests") or 64
        return slots * self.options.get("tokens_per_step", 1) * 1000.0 / self.options["step_ms"]

    def start(self, **extra: Any) -> Incarnation:
        """Start the server (``extra``: flags of this start only); returns once it answers."""
        self.launch(**extra)
        return self.wait_ready()

    def launch(self, **extra: Any) -> None:
        """Start the server's process; :meth:`wait_ready` waits for it to answer."""
        n = len(self.incarnations)
        self.folder.mkdir(parents=True, exist_ok=True)
        log = self.folder / f"ep{self.index}-{n}.jsonl"
        ready = self.folder / f"ep{self.index}-{n}.ready"
        opts = {**self.options, **extra, "port": self.port, "ready_file": ready,
                "request_log": log}  # fmt: skip
        argv = [sys.executable, "-m", "regen", "--log-level", "WARNING", "simulate",
                *options_to_args(with_tokenizer_class(opts))]  # fmt: skip
        launched = time.monotonic()
        proc = launch_simulator(argv, dict(os.environ), self.folder / f"ep{self.index}-{n}.log")
        if self.on_start is not None:
            self.on_start(proc.pid, self.index)
        self.launching = (proc, Incarnation(n, proc.pid, log, launched, options=dict(extra)))

    def wait_ready(self) -> Incarnation:
        """Wait for the launched server to answer; it is then this endpoint's."""
        assert self.launching is not None
        proc, inc = self.launching
        n = inc.n
        ready = self.folder / f"ep{self.index}-{n}.ready"
        deadline = inc.launched + START_TIMEOUT_S
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.folder / f"ep{self.index}-{n}.log").read_text(errors="replace")
                raise RuntimeError(f"endpoint {self.index} did not start: {tail[-2000:]}")
            if ready.exists():
                try:
                    stats = get_json(f"{self.base}/stats")
                    break
                except OSError:
                    pass
            time.sleep(0.05)
        now = time.monotonic()
        inc.started, inc.ready = now - float(stats["uptime_s"]), now
        self.proc, self.launching = proc, None
        self.incarnations.append(inc)
        return inc

    def kill(self) -> float:
        """SIGKILL the server's process group; returns when."""
        assert self.proc is not None
        kill_group(self.proc)
        t = time.monotonic()
        self.incarnations[-1].stopped = t
        self.proc = None
        return t

    def stop(self) -> None:
        if self.launching is not None:  # launched, never answered
            stop_group(self.launching[0], 5)
            self.launching = None
        if self.proc is not None:
            stop_group(self.proc, 5)
            self.incarnations[-1].stopped = time.monotonic()
            self.proc = None

    def stats(self, timeout: float = 2.0) -> dict[str, Any] | None:
        try:
            return get_json(f"{self.base}/stats", timeout)
        except (OSError, ValueError):
            return None


@dataclass(slots=True)
class Reading:
    """One /stats reading of one endpoint."""

    t: float
    endpoint: int
    incarnation: int
    tokens: int  #: tokens generated since that incarnation started (every client's)
    received: int
    completed: int
    running: int
    queued: int
    background_tokens: int
    hung: bool = False
    #: monotonic start of the endpoint's 503 storm (None: not yet), from its /stats
    storm_start: float | None = None


class Poller:
    """Reads every endpoint's /stats every ``interval`` seconds (a thread)."""

    def __init__(self, endpoints: list[Endpoint], interval: float = 1.0) -> None:
        self.endpoints = endpoints
        self.interval = interval
        self.readings: list[Reading] = []
        self._storms: dict[int, float] = {}  #: endpoint -> its storm's start (first reading)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rehearsal-poller", daemon=True)

    def start(self) -> Poller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.poll()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))

    def poll(self) -> list[Reading]:
        got = []
        for ep in self.endpoints:
            if ep.proc is None or not ep.incarnations:
                continue
            inc = ep.incarnations[-1].n
            s = ep.stats(timeout=min(2.0, self.interval * 2))
            if s is None:
                continue
            bg = (s.get("background") or {}).get("tokens", 0)
            t = time.monotonic()
            storm = s.get("overload_started_s")
            storm_start = None if storm is None else t - float(s["uptime_s"]) + float(storm)
            if storm_start is not None:
                self._storms.setdefault(ep.index, storm_start)
            got.append(Reading(t, ep.index, inc, int(s["tokens_generated"]),
                               int(s["received"]), int(s["completed"]), int(s["running"]),
                               int(s["queued"]), int(bg), bool(s.get("hung")),
                               storm_start))  # fmt: skip
        with self._lock:
            self.readings.extend(got)
        return got

    def latest(self) -> dict[tuple[int, int], Reading]:
        """The last reading of every (endpoint, incarnation)."""
        out: dict[tuple[int, int], Reading] = {}
        with self._lock:
            for r in self.readings:
                out[(r.endpoint, r.incarnation)] = r
        return out

    def completed(self) -> int:
        """Requests completed by every incarnation of every endpoint so far."""
        return sum(r.completed for r in self.latest().values())

    def restore(self, readings: list[Reading]) -> Poller:
        """A poller of a finished run, from its saved readings (``--remeasure``)."""
        self.readings = list(readings)
        for r in self.readings:
            if r.storm_start is not None:
                self._storms.setdefault(r.endpoint, r.storm_start)
        return self

    def storm_start(self, endpoint: int) -> float | None:
        """When the endpoint's 503 storm began (monotonic), as its /stats first said; None:
        not yet."""
        return self._storms.get(endpoint)

    def received(self) -> int:
        return sum(r.received for r in self.latest().values())

    def snapshot(self) -> list[Reading]:
        with self._lock:
            return list(self.readings)


def start_fleet(
    n: int, folder: Path, options: dict[str, Any], per_endpoint: dict[int, dict[str, Any]],
    on_start: Any = None,
) -> list[Endpoint]:  # fmt: skip
    """``n`` endpoints on free ports, each started with ``options`` plus its own flags
    (``per_endpoint[i]``: a second client, a scheduled hang or 503 storm), all launched before
    the first is waited for. The caller stops them (:meth:`Endpoint.stop`); on a failed start
    the ones started are stopped."""
    eps = [Endpoint(i, free_port(), {**options, **per_endpoint.get(i, {})}, folder,
                    on_start=on_start) for i in range(n)]  # fmt: skip
    try:
        for ep in eps:
            ep.launch()
        for ep in eps:
            ep.wait_ready()
    except BaseException:
        for ep in eps:
            ep.stop()
        raise
    return eps


@contextlib.contextmanager
def fleet(
    n: int, folder: Path, options: dict[str, Any], per_endpoint: dict[int, dict[str, Any]],
    on_start: Any = None,
) -> Iterator[list[Endpoint]]:  # fmt: skip
    """:func:`start_fleet`, stopped at the end."""
    eps = start_fleet(n, folder, options, per_endpoint, on_start)
    try:
        yield eps
    finally:
        for ep in eps:
            ep.stop()


def read_log(inc: Incarnation) -> list[dict[str, Any]]:
    """The incarnation's request log, each line with ``at`` (monotonic time it was written)."""
    out = []
    if not inc.log.exists():
        return out
    for line in inc.log.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:  # the last line of a killed server may be cut
            continue
        rec["at"] = inc.started + float(rec["t"])
        out.append(rec)
    return out
