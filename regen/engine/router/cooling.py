"""Cooling: an endpoint that answered "overloaded" gets no new request for a while.

An :class:`~regen.core.errors.OverloadedError` (SGLang's 503 for a full queue, a timeout abort
or a retraction; a gateway's 429) is not sickness, but it cools the endpoint: for
``OVERLOAD_COOL_S``, doubled with each overload in a row up to ``OVERLOAD_COOL_MAX_S``, it gets
no new request while another endpoint is up, and a sample bound to it goes elsewhere
(regen.engine.router.choice). A success ends the cool-down. Without it, a server refusing
everything at once holds the fewest requests and so draws every new one (least loaded): a 503
storm on one endpoint of eight once left the other seven at 5% of their batches, their work
held by samples backing off for it.

Owns no files.
"""

from __future__ import annotations

from collections.abc import Iterable

from regen.engine.router.state import UP, EndpointState

#: seconds an endpoint gets no new request after an overload answer, while another is up;
#: doubled with each overload in a row, up to OVERLOAD_COOL_MAX_S (a success ends it)
OVERLOAD_COOL_S = 0.5
OVERLOAD_COOL_MAX_S = 8.0


def overloaded(s: EndpointState, now: float) -> None:
    """Count one overload answer in a row and cool the endpoint for its share of time."""
    s.consecutive_overloads += 1
    cool = OVERLOAD_COOL_S * 2 ** min(16, s.consecutive_overloads - 1)
    s.cool_until = now + min(OVERLOAD_COOL_MAX_S, cool)


def calm(s: EndpointState) -> None:
    """The endpoint answered: its overload streak and cool-down end."""
    s.consecutive_overloads = 0
    s.cool_until = None


def cooling(states: Iterable[EndpointState], now: float) -> set[str]:
    """The endpoints in rotation that are cooling now."""
    return {s.url for s in states if s.state == UP and s.cooling(now)}


def cool_waits(states: Iterable[EndpointState], now: float) -> list[float]:
    """Seconds until each cooling endpoint may take requests again."""
    return [s.cool_until - now for s in states if s.cool_until is not None and now < s.cool_until]
