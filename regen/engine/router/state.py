"""What the router knows of one endpoint, and the lease a request holds on it.

- the endpoint's place in rotation: ``up``, ``half_open`` (one trial request may pass),
  ``down`` and ``stalled`` (out until a probe or a trial passes), ``refused`` (out for the
  session); :func:`worse` orders them for a view of several workers' routers;
- its counters (requests, answers, failures, overloads, stalls), latency (the sum and a moving
  average) and the server's last ``/metrics`` reading, which :meth:`EndpointState.stats` turns
  into the plain dict of the progress snapshot.

Owns no files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

UP = "up"
DOWN = "down"
STALLED = "stalled"  #: its streams stopped: out of rotation until a probe passes
HALF_OPEN = "half_open"
REFUSED = "refused"  #: an endpoint-wide fault: out for the session

#: states out of rotation that a probe (or a half-open trial) brings back
PROBED = frozenset({DOWN, STALLED})
#: the states from best to worst (what a view of several workers' routers shows: the worst)
SEVERITY = {UP: 0, HALF_OPEN: 1, DOWN: 2, STALLED: 3, REFUSED: 4}

#: weight of the newest latency in the moving average
LATENCY_EWMA_ALPHA = 0.2


def worse(a: str | None, b: str) -> str:
    """The worse of two endpoint states (``a`` None: ``b``)."""
    return b if a is None or SEVERITY.get(b, 0) > SEVERITY.get(a, 0) else a


@dataclass(slots=True)
class EndpointState:
    """One endpoint as the router tracks it."""

    url: str
    weight: float = 1.0
    limit: int | None = None
    in_flight: int = 0
    requests: int = 0
    ok: int = 0
    failures: int = 0
    throttled: int = 0  #: overload answers (503 / 429)
    consecutive_failures: int = 0
    consecutive_overloads: int = 0
    stalls: int = 0  #: requests cancelled as stalled
    consecutive_stalls: int = 0
    checking: bool = False  #: a health check after an overload streak is running
    cool_until: float | None = None  #: no new request before this while another is up
    slots_source: str | None = None  #: which server value sized the limit (EndpointInfo)
    state: str = UP
    down_since: float | None = None
    next_probe_at: float | None = None
    trial_in_flight: bool = False
    latency_sum_s: float = 0.0
    latency_ewma_s: float | None = None
    last_error: str | None = None
    refusal: str | None = None  #: why it was refused, and what to fix (state REFUSED)
    stall_reason: str | None = None  #: why it last left rotation as stalled
    others: float = 0.0  #: requests the server holds besides ours (its last reading)
    server: dict[str, Any] | None = None  #: the server's last reading (ServerLoad.to_dict)

    @classmethod
    def of(cls, endpoint: Any) -> EndpointState:
        """From a URL, a :class:`regen.manifest.Endpoint` or a
        :class:`regen.client.EndpointInfo` (weight, max_running_requests and slots_source are
        read when it has them)."""
        if isinstance(endpoint, str):
            return cls(url=endpoint.rstrip("/"))
        return cls(
            url=endpoint.url,
            weight=float(getattr(endpoint, "weight", 1.0)),
            limit=getattr(endpoint, "max_running_requests", None),
            slots_source=getattr(endpoint, "slots_source", None),
        )

    def has_room(self) -> bool:
        return self.limit is None or self.in_flight < self.limit

    def cooling(self, now: float) -> bool:
        return self.cool_until is not None and now < self.cool_until

    def record_latency(self, seconds: float) -> None:
        """Add one request's latency to the sum and the moving average."""
        self.latency_sum_s += seconds
        self.latency_ewma_s = (
            seconds
            if self.latency_ewma_s is None
            else (1 - LATENCY_EWMA_ALPHA) * self.latency_ewma_s + LATENCY_EWMA_ALPHA * seconds
        )

    def read_server(self, load: Any) -> None:
        """The server's own reading (a :class:`regen.client.server_load.ServerLoad`; None: no
        fresh one): what it holds beyond the router's requests."""
        total = None if load is None else load.load
        if total is None:
            self.others, self.server = 0.0, None
            return
        self.others = max(0.0, total - self.in_flight)
        self.server = load.to_dict()

    def stats(self, now: float) -> dict[str, Any]:
        """Its numbers as a plain JSON-able dict (for the progress snapshot)."""
        done = self.ok + self.failures + self.throttled
        ewma = self.latency_ewma_s
        return {
            "state": self.state,
            "in_flight": self.in_flight,
            "limit": self.limit,
            "weight": self.weight,
            "requests": self.requests,
            "ok": self.ok,
            "failures": self.failures,
            "throttled": self.throttled,
            "consecutive_failures": self.consecutive_failures,
            "consecutive_overloads": self.consecutive_overloads,
            "stalls": self.stalls,
            "slots_source": self.slots_source,
            "latency_avg_s": round(self.latency_sum_s / done, 4) if done else None,
            "latency_ewma_s": None if ewma is None else round(ewma, 4),
            "down_for_s": None if self.down_since is None else round(now - self.down_since, 3),
            "last_error": self.last_error,
            "refusal": self.refusal,
            "stall_reason": self.stall_reason,
            "server": self.server,
        }


@dataclass(slots=True)
class Lease:
    """One request's hold on an endpoint; give it back with
    :meth:`regen.engine.router.EndpointRouter.release`."""

    url: str
    sample_id: str
    started_at: float
    trial: bool = False  #: a half-open trial request
