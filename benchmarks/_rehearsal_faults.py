"""The rehearsal's faults: when each happens and how it is made (issue 32).

:class:`Schedule` says when (a share of the samples done, as the run's progress.json says, or
of the requests, which the hang's and the storm's servers count) and for how long;
:class:`FaultLog` records what really happened (monotonic start and end, the progress at the
start, details), which the report prints and the CI test asserts. In the order they come:

- **second client**: one endpoint runs ``regen simulate --background-requests B`` for the whole
  run (another client of a shared server, holding B of its batch slots);
- **hang**: one endpoint runs with ``--hang-after N --hang-for-s D`` (its scheduler stops when
  its N-th request arrives: N is its share of the requests at the scheduled progress; D is
  longer than production's stall floor, ``engine.stall_min_s`` 30 s, plus its check), so
  regen must notice and move the work;
- **503 storm**: one endpoint runs with ``--overload-after N --overload-for-s D`` (its N-th
  request starts the storm: N is its share of the requests at the scheduled progress; a count,
  not a time, so a slow start-up on a busy machine cannot put the storm before the first
  request);
- **disk full**: the run directory lives on a tmpfs of its own (:class:`TmpfsDisk`, mounted by
  this process: root); the disk fills when the tmpfs is shrunk to what it holds
  (``mount -o remount,size=USED``: the next write that needs a page gets ENOSPC, as on a
  full disk) and space comes back ``D`` seconds after regen said the disk is full (remounted
  at its full size): regen writes a page only now and then (a part, progress.json; a
  journal line lands in a page it has), so a fixed few seconds could pass with no write
  on a slow machine (a CI run at 9c9d039: 3 s, and regen met no full disk). Regen not
  saying so within ``disk_hold_max_s`` frees it then, and the report shows it said nothing.
  The session that stops on it is started again then. Without the right to mount (not root),
  the fault is skipped and the report says so;
- **endpoint down**: one endpoint's process group is SIGKILLed and started again on the same
  port ``D`` seconds later (:class:`~benchmarks._rehearsal_fleet.Endpoint`);
- **driver killed**: ``regen run``'s whole process group is SIGKILLed
  (:func:`regen.devkit.procs.kill_group`) and the same command started again once the old session's
  actors are gone;
- **actor killed**: one of the session's Ray actor processes is SIGKILLed (found through Ray's
  state API, else by process title).

The last four are the rehearsal's own (``Rehearsal.loop``): each waits for its share of the
run, for the previous one to be over (its session's first request again, its endpoint back)
plus ``gap_s``, for the storm's window to be past and for no endpoint to be hung, so their
costs can be told apart (and a session started again never starts beside a hung server, which
it would leave out: see the report's findings).

Owns the tmpfs it mounts (unmounted at the end; ``--keep`` copies the run directory out first).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._proctree import ACTOR_TITLES, cmdline


@dataclass(slots=True)
class Schedule:
    """When each fault happens (share of the expected requests completed) and its length."""

    background_endpoint: int = 7
    background_requests: int = 6  #: the second client's requests kept in that server
    hang_endpoint: int = 2
    hang_at: float = 0.08
    hang_for_s: float = 90.0
    storm_endpoint: int = 5
    storm_at: float = 0.22  #: the share of the requests at which the storm starts
    storm_for_s: float = 30.0
    disk_at: float = 0.27
    disk_for_s: float = 10.0  #: full this long after regen said so
    disk_hold_max_s: float = 90.0  #: ... or this long if it never does
    down_endpoint: int = 4
    down_at: float = 0.33
    down_for_s: float = 30.0
    driver_at: float = 0.40
    actor_at: float = 0.55
    gap_s: float = 15.0  #: a fault waits this long after the previous one is over

    @classmethod
    def ci(cls) -> Schedule:
        """Shorter outages for the CI size (a run of a few minutes); the hang stays longer than
        the CI's stall floor (``Config.ci``: ``engine.stall_min_s`` 15 s) plus its check."""
        return cls(
            background_requests=3,
            hang_for_s=40.0,
            disk_for_s=3.0,
            down_for_s=8.0,
            storm_for_s=8.0,
            gap_s=5.0,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class Event:
    """One fault as it happened (monotonic clock)."""

    name: str
    start: float
    end: float | None = None
    progress: float = 0.0  #: share of the expected requests completed at its start
    endpoint: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, t0: float) -> dict[str, Any]:
        return {"name": self.name, "endpoint": self.endpoint,
                "at_s": round(self.start - t0, 2),
                "end_s": None if self.end is None else round(self.end - t0, 2),
                "progress": round(self.progress, 4), **self.details}  # fmt: skip


@dataclass
class FaultLog:
    events: list[Event] = field(default_factory=list)

    def add(self, name: str, start: float, **kw: Any) -> Event:
        e = Event(name, start, **kw)
        self.events.append(e)
        return e

    def named(self, name: str) -> list[Event]:
        return [e for e in self.events if e.name == name]


# -- the disk ---------------------------------------------------------------------------------


class TmpfsDisk:
    """A tmpfs mounted at ``path`` (needs root): a disk that can be filled and freed."""

    def __init__(self, path: Path, size_bytes: int) -> None:
        self.path = path
        self.size = size_bytes
        self.mounted = False
        self.error = ""

    def mount(self) -> bool:
        self.path.mkdir(parents=True, exist_ok=True)
        argv = ["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0755", "rehearsal",
                str(self.path)]  # fmt: skip
        r = subprocess.run(argv, capture_output=True, text=True)
        self.mounted = r.returncode == 0
        self.error = (r.stderr or r.stdout).strip()
        return self.mounted

    def used(self) -> int:
        st = os.statvfs(self.path)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def _remount(self, size: int) -> bool:
        argv = ["mount", "-o", f"remount,size={size}", str(self.path)]
        return subprocess.run(argv, capture_output=True).returncode == 0

    def fill(self, tries: int = 50) -> int:
        """Shrink the disk to what it holds: the next write that needs a page fails. The run
        writes on, and a tmpfs refuses a size below what it holds, so it measures again and
        retries (a slack of a few pages at last)."""
        page = os.sysconf("SC_PAGE_SIZE")
        for i in range(tries):
            used = self.used()
            slack = page * (i // 10) * 4  # 0 for the first ten tries
            if self._remount(max(page, -(-used // page) * page + slack)):
                return used
            time.sleep(0.02)
        raise OSError(f"could not shrink the tmpfs at {self.path} to what it holds")

    def free(self) -> None:
        if not self._remount(self.size):
            raise OSError(f"could not give the tmpfs at {self.path} its size back")

    def unmount(self, keep: tuple[Path, Path] | None = None) -> None:
        """Copy ``keep``'s source (below the mount) to its destination, then unmount."""
        if not self.mounted:
            return
        if keep is not None and keep[0].exists():
            shutil.copytree(keep[0], keep[1], dirs_exist_ok=True)
        for _ in range(20):
            r = subprocess.run(["umount", str(self.path)], capture_output=True)
            if r.returncode == 0:
                break
            time.sleep(0.5)
        self.mounted = False


# -- the actors -------------------------------------------------------------------------------


def run_session(run_dir: Path) -> str | None:
    """The session id in the run directory's lock (the actors' names carry it)."""
    try:
        return str(json.loads((run_dir / "lock.json").read_text())["session"])
    except (OSError, ValueError, KeyError):
        return None


def actor_pids(session: str | None) -> list[tuple[int, str]]:
    """(pid, title) of this machine's Ray actor processes of ``session`` (any when None)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        cmd = cmdline(int(p.name))
        if cmd.startswith(ACTOR_TITLES) and (session is None or session in cmd):
            out.append((int(p.name), cmd.split(" ", 1)[0]))
    return sorted(out)


def kill_actor(actors: list[tuple[int, str]]) -> tuple[int, str] | None:
    """SIGKILL one of ``actors`` ((pid, name), the last); None when there is none."""
    if not actors:
        return None
    pid, title = actors[-1]
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return pid, title


def wait_gone(pids: list[int], timeout_s: float) -> float:
    """Seconds until none of ``pids`` runs (a zombie counts as gone), at most ``timeout_s``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        alive = False
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            alive = alive or state not in ("Z", "X")
        if not alive:
            break
        time.sleep(0.1)
    return time.monotonic() - t0
