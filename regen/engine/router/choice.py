"""Choice: which endpoint takes a request that has no usable binding.

- **Excluded**: the endpoints the sample avoids (regen.engine.router.affinity), unless no other
  endpoint is up; then the cooling ones (regen.engine.router.cooling), while another is up.
- **A half-open trial first**: an endpoint let back for one trial request gets it (its first
  real request decides whether it is back).
- **Least loaded, weighted**: among the endpoints up, with room and not excluded, the one with
  the lowest ``(in_flight + others + 1) / weight`` (ties: manifest order). ``others`` is what the
  server holds besides the router's requests: its last ``/metrics`` reading of running plus
  queued requests (every client's) less the router's in flight at that reading; 0 without a
  fresh reading (then it is least outstanding, as regen's own count is all it knows).

Owns no files.
"""

from __future__ import annotations

from collections.abc import Collection

from regen.engine.router.cooling import cooling
from regen.engine.router.state import HALF_OPEN, UP, EndpointState


def another_up(states: Collection[EndpointState], besides: set[str]) -> bool:
    """Whether an endpoint outside ``besides`` is up."""
    return any(s.state == UP and s.url not in besides for s in states)


def excluded(states: Collection[EndpointState], avoided: set[str], now: float) -> set[str]:
    """The endpoints a sample's next request does not go to (see the module docstring)."""
    skip = avoided if avoided and another_up(states, avoided) else set()
    cool = cooling(states, now)
    if cool and another_up(states, skip | cool):
        skip |= cool  # another is up: the endpoints that just refused get nothing new
    return skip


def trial_open(s: EndpointState) -> bool:
    """Half open, and its trial request not yet sent."""
    return s.state == HALF_OPEN and not s.trial_in_flight


def choose(states: Collection[EndpointState], skip: set[str]) -> EndpointState | None:
    """A half-open endpoint's trial, else the least loaded (weighted) endpoint up with room;
    None when none may take the request."""
    for s in states:
        if trial_open(s) and s.url not in skip:
            return s  # probe it with a real request first
    chosen, best = None, None
    for s in states:
        if s.state != UP or not s.has_room() or s.url in skip:
            continue
        score = (s.in_flight + s.others + 1) / s.weight
        if best is None or score < best:
            best, chosen = score, s
    return chosen
