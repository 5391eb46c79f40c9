"""Which endpoint gets the next request: :class:`EndpointRouter` and its parts.

- :mod:`.endpoint_router`: :class:`EndpointRouter`, the leases a worker's requests hold, their
  outcomes, the in-flight limit per endpoint, and waiting for room;
- :mod:`.choice`: least loaded, weighted (regen's in flight plus what the server's
  ``/metrics`` says other clients hold), a half-open endpoint's trial first;
- :mod:`.affinity`: all turns of one sample go to the endpoint that served its first turn
  (prefix cache); the endpoints a sample avoids after a stall or an overload;
- :mod:`.cooling`: an overload answer is not sickness, but the endpoint gets no new request for
  a while, while another is up;
- :mod:`.health`: failures, stalls and refusals take an endpoint out of rotation; probes and
  half-open trials bring it back;
- :mod:`.probe`: the default probe (SGLang's ``/health_generate``);
- :mod:`.state`: one endpoint's record, its states and counters, and a request's lease.

All asyncio, single event loop. Owns no files on disk.
"""

from regen.engine.router.cooling import OVERLOAD_COOL_MAX_S, OVERLOAD_COOL_S
from regen.engine.router.endpoint_router import EndpointRouter, no_endpoint_message
from regen.engine.router.health import STALL_STREAK
from regen.engine.router.probe import PROBE_TIMEOUT_S, ProbeFn, http_probe, keyed_probe
from regen.engine.router.state import (
    DOWN,
    HALF_OPEN,
    LATENCY_EWMA_ALPHA,
    PROBED,
    REFUSED,
    SEVERITY,
    STALLED,
    UP,
    EndpointState,
    Lease,
    worse,
)

__all__ = [
    "DOWN",
    "HALF_OPEN",
    "LATENCY_EWMA_ALPHA",
    "OVERLOAD_COOL_MAX_S",
    "OVERLOAD_COOL_S",
    "PROBED",
    "PROBE_TIMEOUT_S",
    "REFUSED",
    "SEVERITY",
    "STALLED",
    "STALL_STREAK",
    "UP",
    "EndpointRouter",
    "EndpointState",
    "Lease",
    "ProbeFn",
    "http_probe",
    "keyed_probe",
    "no_endpoint_message",
    "worse",
]
