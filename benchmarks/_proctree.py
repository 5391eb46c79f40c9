"""CPU of a whole process tree, read from ``/proc`` (issue 16). Not a test; imported by
``benchmarks/cpu.py``.

:class:`TreeSampler` watches every descendant of one root process (the benchmark's child: a
regen driver with the local Ray it starts, or a plain asyncio pool) every ``interval`` seconds in
a thread: for each process (keyed by pid and start time, so a reused pid is a new process) its
user + system CPU (``/proc/PID/stat`` fields 14-15: all its threads, live and exited) and its
command line, which decides its group:

- ``root``: the root process itself (the regen driver, or the pool);
- ``actors``: Ray workers whose title names the actor class (``ray::WorkerActor...``);
- ``ray``: everything else under the root (GCS, raylet, dashboard agents, idle workers, ...).

The root is made a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, see
:func:`become_subreaper`) so a process whose parent dies stays in the tree instead of moving
to init. A process that exits is counted up to its last sample (at most ``interval`` of its CPU
is missed; zombies still show their totals); :meth:`TreeSampler.at` interpolates each process's
CPU linearly between samples, so a window that starts or ends between samples is exact up to
that interpolation.

It also samples, on the same ticks, the whole machine's busy CPU (``/proc/stat``: user, nice,
system, irq, softirq, steal of every core) and the CPU of a few other named processes
(``also``: the simulated server), so a report can say how busy the machine was over a window
and how much of that was neither the client nor its server (:meth:`TreeSampler.machine`;
the machine is shared: other people's work slows every contender down).
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36
GROUPS = ("root", "actors", "ray")


def become_subreaper() -> None:
    """Orphaned descendants of this process are re-parented to it (Linux), not to init."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _stat(pid: str) -> tuple[int, int, float] | None:
    """(ppid, start time in ticks, CPU seconds) of ``pid``; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw.rsplit(b")", 1)[1].split()
    # after "pid (comm)": state ppid ... utime(12) stime(13) ... starttime(20), 0-based here
    return int(fields[1]), int(fields[19]), (int(fields[11]) + int(fields[12])) / CLK_TCK


def _machine_busy() -> float:
    """CPU seconds every core of the machine has been busy since boot (``/proc/stat``)."""
    with open("/proc/stat", "rb") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _threads(pid: int, into: dict[int, tuple[str, float]]) -> None:
    """Each thread's name and CPU seconds (``/proc/PID/task``), latest values."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_bytes()
        except OSError:
            continue
        name = raw[raw.index(b"(") + 1 : raw.rindex(b")")].decode(errors="replace")
        fields = raw.rsplit(b")", 1)[1].split()
        into[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / CLK_TCK)


def group_of(cmdline: str, *, is_root: bool) -> str:
    if is_root:
        return "root"
    if cmdline.startswith("ray::WorkerActor"):
        return "actors"
    return "ray"


@dataclass(slots=True)
class _Proc:
    pid: int
    cmdline: str
    times: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    threads: dict[int, tuple[str, float]] = field(default_factory=dict)  #: tid -> (name, CPU)

    def at(self, t: float) -> float:
        """CPU seconds at time ``t`` (0 before its first sample, its last value after)."""
        if not self.times or t < self.times[0]:
            return 0.0
        i = bisect.bisect_right(self.times, t)
        if i >= len(self.times):
            return self.cpu[-1]
        t0, t1 = self.times[i - 1], self.times[i]
        c0, c1 = self.cpu[i - 1], self.cpu[i]
        return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1


class TreeSampler:
    """Samples the CPU of ``root`` and all its descendants in a background thread."""

    def __init__(
        self, root: int, interval: float = 0.1, *, also: Mapping[str, int] | None = None
    ) -> None:
        """``also``: other processes (name -> pid) whose CPU is sampled on the same ticks,
        apart from the tree (:meth:`machine`)."""
        self.root = root
        self.interval = interval
        self.procs: dict[tuple[int, int], _Proc] = {}
        self.busy = _Proc(0, "/proc/stat")  #: the whole machine's busy CPU seconds
        self.also = {name: _Proc(pid, name) for name, pid in (also or {}).items()}
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> TreeSampler:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread after one last sample (take it while the root is still a zombie)."""
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        now = time.monotonic()
        self.busy.times.append(now)
        self.busy.cpu.append(_machine_busy())
        for other in self.also.values():
            st = _stat(str(other.pid))
            if st is not None:
                other.times.append(now)
                other.cpu.append(st[2])
        table: dict[int, tuple[int, int, float]] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                st = _stat(name)
                if st is not None:
                    table[int(name)] = st
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        stack, seen = [self.root], set()
        while stack:
            pid = stack.pop()
            if pid in seen or pid not in table:
                continue
            seen.add(pid)
            stack.extend(children.get(pid, ()))
            _, start, cpu = table[pid]
            proc = self.procs.get((pid, start))
            if proc is None:
                proc = self.procs[(pid, start)] = _Proc(pid, _cmdline(pid))
            elif not proc.cmdline.startswith("ray::WorkerActor"):  # titles change once
                proc.cmdline = _cmdline(pid) or proc.cmdline
            proc.times.append(now)
            proc.cpu.append(cpu)
            if proc.cmdline.startswith("ray::WorkerActor"):
                _threads(pid, proc.threads)

    def at(self, t: float) -> dict[str, float]:
        """CPU seconds per group at time ``t`` (monotonic clock)."""
        out = dict.fromkeys(GROUPS, 0.0)
        for p in self.procs.values():
            out[group_of(p.cmdline, is_root=p.pid == self.root)] += p.at(t)
        return out

    def total(self) -> dict[str, float]:
        return self.at(float("inf"))

    def between(self, t0: float, t1: float) -> dict[str, float]:
        a, b = self.at(t0), self.at(t1)
        return {g: b[g] - a[g] for g in GROUPS}

    def machine(self, t0: float, t1: float) -> dict[str, float]:
        """Cores busy on average over ``[t0, t1]``: ``all`` (the whole machine), ``tree``
        (the root and its descendants), each ``also`` process by name, and ``others``
        (everything else: other users' work, the sampler itself); ``cores`` the machine's."""
        span = t1 - t0
        if span <= 0:
            return {}
        out = {"all": (self.busy.at(t1) - self.busy.at(t0)) / span}
        out["tree"] = sum(self.between(t0, t1).values()) / span
        for name, p in self.also.items():
            out[name] = (p.at(t1) - p.at(t0)) / span
        out["others"] = max(0.0, out["all"] - sum(v for k, v in out.items() if k != "all"))
        out["cores"] = float(os.cpu_count() or 1)
        return out

    def actor_threads(self) -> dict[str, float]:
        """CPU seconds of the actors' threads by name (summed over actors; whole run)."""
        out: dict[str, float] = {}
        for p in self.procs.values():
            for name, cpu in p.threads.values():
                out[name] = out.get(name, 0.0) + cpu
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def count(self, group: str) -> int:
        return sum(
            1
            for p in self.procs.values()
            if group_of(p.cmdline, is_root=p.pid == self.root) == group
        )


@contextlib.contextmanager
def sampling(root: int, interval: float = 0.1) -> Iterator[TreeSampler]:
    s = TreeSampler(root, interval).start()
    try:
        yield s
    finally:
        s.stop()
