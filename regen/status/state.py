"""The state of a run, from its progress file, its lock and the reader's clock.

- clocks: heartbeats, progress and token times are the driver's clock, ``now`` the reader's;
  when the driver ran on another host, ``CLOCK_SKEW_S`` is added to the stale and stall limits;
- state: ``unknown`` (the progress file is damaged, or missing beside stored parts while no
  session holds the lock: the numbers shown are what the part records hold, with the plan's
  totals, and the reason says to run ``regen verify --repair``, which rebuilds it; never read
  as an empty run); ``running``; ``stalled`` (holder alive but no new completion tokens for
  ``stall_after_s``); ``dead`` (progress says running but the lock holder is gone: lock missing,
  or gone by the lock's one staleness rule, regen.store.lock.why_gone); ``finished`` /
  ``interrupted`` / ``failed`` (as the driver last wrote); ``starting`` / ``empty`` (no
  progress file yet, holder alive / not).

Pure functions of those records and ``now``; owns no files.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from regen.status.records import Holder
from regen.store import layout
from regen.store.layout import LockRecord
from regen.store.lock import CLOCK_SKEW_S, fmt_age, pid_is_alive, why_gone
from regen.store.progress import ProgressSnapshot

#: no new completion tokens for this long while the holder lives = stalled
STALL_AFTER_S = 300.0
#: the states in which a session works on the run (its in-flight numbers are current)
LIVE = ("running", "stalled", "starting")
#: the states in which nobody works on the run (no time estimate)
ENDED = ("dead", "failed", "interrupted", "finished")


def stall_limit(
    p: ProgressSnapshot | None, stall_after_s: float, hostname: str | None = None
) -> float:
    """``stall_after_s``, plus ``CLOCK_SKEW_S`` unless the driver wrote from this host."""
    local = p is not None and p.host == (socket.gethostname() if hostname is None else hostname)
    return stall_after_s + (0.0 if local else CLOCK_SKEW_S)


def read_holder(
    lock: LockRecord | None,
    now: float,
    *,
    hostname: str | None = None,
    pid_alive: Callable[[int], bool] = pid_is_alive,
) -> Holder | None:
    """The lock holder and whether it is alive (the lock's one rule: regen.store.lock.why_gone)."""
    if lock is None:
        return None
    why = why_gone(lock, now, hostname=hostname, pid_alive=pid_alive)
    return Holder(
        owner=lock.owner,
        host=lock.host,
        pid=lock.pid,
        session=lock.session,
        heartbeat_age_s=lock.age(now),
        alive=not why,
        why_gone=why,
    )


def run_state(
    p: ProgressSnapshot | None,
    holder: Holder | None,
    growth: float | None,
    now: float,
    stall_limit: float,
    progress_error: str = "",
) -> tuple[str, str]:
    """The run's state and why (the module docstring's definitions): from the progress file's
    last state (``progress_error``: why it could not be read, and what to do), the lock holder,
    the last time completion tokens grew and ``now``."""
    if progress_error:
        return "unknown", progress_error
    alive = holder is not None and holder.alive
    new_session = holder is not None and bool(holder.session) and p is not None and (
        holder.session != p.session)  # fmt: skip
    if p is None:
        return ("starting" if alive else "empty"), f"no {layout.PROGRESS} yet"
    if p.state != "running":
        if alive and new_session:
            assert holder is not None
            return "starting", f"new session {holder.session} (last: {p.state})"
        return p.state, ""
    last = max(growth or p.started_at, p.started_at)
    if not alive:
        return "dead", holder.why_gone if holder else f"{layout.LOCK} is gone"
    if new_session:
        assert holder is not None
        return "starting", f"new session {holder.session}"
    if now - last > stall_limit:
        return "stalled", f"no new tokens for {fmt_age(now - last)}"
    if now - p.updated_at > stall_limit:
        return "stalled", f"{layout.PROGRESS} not updated for {fmt_age(now - p.updated_at)}"
    return "running", ""
