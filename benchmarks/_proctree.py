"""Process trees read from ``/proc``: CPU and memory by group over time, and one command's peak
memory. Not a test; the one sampler of the benchmarks (``benchmarks/cpu.py``,
``benchmarks/rehearsal.py``, ``benchmarks/_rehearsal_faults.py``). Owns no files.

:class:`TreeSampler` walks the descendants of a root process (this one by default) every
``interval`` seconds in a thread and keeps, per process (keyed by pid and start time, so a
reused pid is a new process), its user + system CPU (``/proc/PID/stat`` fields 14-15: all its
threads, live and exited) and its resident set size (field 24) over time; with ``threads``, the
CPU of each thread of the actors too. On the same ticks it samples the whole machine's busy CPU
(``/proc/stat``: user, nice, system, irq, softirq, steal of every core) and the CPU of a few
other named processes (``also``), so a report can say how busy the machine was over a window and
how much of that was neither the tree nor those processes (others' work on a shared machine).

Every process belongs to one group, by one rule:

- a command line that starts with an actor's title (:data:`ACTOR_TITLES`: Ray's
  ``ray::WorkerActor``, or ``ray::regen-...`` for regen's named actors) is ``actors``; an idle
  Ray worker that becomes an actor changes group, its whole history with it;
- a registered process (the root is, :meth:`TreeSampler.register`) is its group;
- any other is ``ray`` when its command line is Ray's own (a ``ray::`` title, or a path in Ray's
  package: Ray's daemons), else the ``below`` of its nearest registered ancestor (by default
  that ancestor's group).

``benchmarks/cpu.py`` samples the tree of its child (``root``: the regen driver or the pool; its
Ray processes ``ray``); the rehearsal samples its own tree (``harness``) and registers each
simulator, driver and tool it starts (``sim:3``, ``driver:1``, ``tool:export``, ...).

The root's process should be a child subreaper (:func:`become_subreaper`) so an orphan stays in
the tree instead of moving to init. A process that exits is counted up to its last sample (at
most ``interval`` of its CPU is missed; zombies still show their totals); CPU is interpolated
linearly between samples, so a window that starts or ends between samples is exact up to that
interpolation.

:func:`run_measured` runs one command with its process tree's summed RSS read every 20 ms (a
few pids, not all of ``/proc``): wall time, exit status, output and that peak (and ``ru_maxrss``
of the largest process, from ``wait4``).
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import os
import resource
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
PR_SET_CHILD_SUBREAPER = 36
#: the titles of Ray's actor processes (regen names its actors ``regen-SESSION-wN-G``)
ACTOR_TITLES = ("ray::WorkerActor", "ray::regen-")
#: a part of the command line of every Ray daemon and worker (Ray's own package path)
RAY_PATH = "/site-packages/ray/"
#: the deepest ancestry walked to find a process's registered ancestor
MAX_DEPTH = 64


def become_subreaper() -> None:
    """Orphaned descendants of this process are re-parented to it (Linux), not to init."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def read_stat(pid: int | str) -> tuple[int, int, float, int] | None:
    """(ppid, start ticks, CPU seconds, RSS bytes) of ``pid``; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    f = raw.rsplit(b")", 1)[1].split()
    # after "pid (comm)": state(0) ppid(1) ... utime(11) stime(12) ... starttime(19) ... rss(21)
    return int(f[1]), int(f[19]), (int(f[11]) + int(f[12])) / CLK_TCK, int(f[21]) * PAGE


def cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def machine_busy() -> float:
    """CPU seconds every core of the machine has been busy since boot (``/proc/stat``)."""
    with open("/proc/stat", "rb") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    # user, nice, system, idle, iowait, irq, softirq, steal
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / CLK_TCK


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


def _interpolate(times: list[float], values: list[float], t: float) -> float:
    """The value at ``t`` between two samples (the last one after the end)."""
    i = bisect.bisect_right(times, t)
    if i >= len(times):
        return values[-1]
    t0, t1, v0, v1 = times[i - 1], times[i], values[i - 1], values[i]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1


def is_actor(cmd: str) -> bool:
    return cmd.startswith(ACTOR_TITLES)


def is_ray(cmd: str) -> bool:
    """Ray's own process: a ``ray::`` title or a command line in Ray's package."""
    return cmd.startswith("ray::") or RAY_PATH in cmd


@dataclass(slots=True)
class Proc:
    """One process's samples: CPU seconds and RSS bytes at each time it was seen."""

    pid: int
    group: str
    cmd: str
    times: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    threads: dict[int, tuple[str, float]] = field(default_factory=dict)  #: tid -> (name, CPU)

    def cpu_at(self, t: float) -> float:
        """CPU seconds at ``t`` (0 before the first sample, the last value after)."""
        if not self.times or t < self.times[0]:
            return 0.0
        return _interpolate(self.times, self.cpu, t)


class TreeSampler:
    """Samples the CPU and RSS of ``root`` and its descendants, by group, in a thread."""

    def __init__(
        self,
        root: int | None = None,
        interval: float = 0.1,
        *,
        group: str = "root",
        below: str | None = None,
        groups: tuple[str, ...] = (),
        also: Mapping[str, int] | None = None,
        threads: bool = False,
    ) -> None:
        """``root`` (this process by default) is registered as ``group``, its unregistered
        descendants ``below`` it; ``groups``: those every reading reports, at 0 when empty;
        ``also``: other processes (name -> pid) sampled on the same ticks, apart from the tree
        (:meth:`machine`); ``threads``: sample the actors' threads too."""
        self.root = os.getpid() if root is None else root
        self.interval = interval
        self.procs: dict[tuple[int, int], Proc] = {}
        #: registered pid -> (its group, the group of its unregistered descendants)
        self.roots: dict[int, tuple[str, str]] = {self.root: (group, below or group)}
        self.known = groups
        self.busy_t: list[float] = []  #: sample times of the machine's busy CPU
        self.busy: list[float] = []  #: the machine's busy CPU seconds since boot
        self.also = {name: Proc(pid, name, name) for name, pid in (also or {}).items()}
        self.threads = threads
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="proctree", daemon=True)

    def register(self, pid: int, group: str, below: str | None = None) -> None:
        """``pid`` belongs to ``group``, and its descendants to ``below`` (default: the same)."""
        with self._lock:
            self.roots[pid] = (group, below or group)

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
        busy = machine_busy()
        table: dict[int, tuple[int, int, float, int]] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                st = read_stat(name)
                if st is not None:
                    table[int(name)] = st
        with self._lock:
            self.busy_t.append(now)
            self.busy.append(busy)
            for other in self.also.values():
                st = table.get(other.pid) or read_stat(other.pid)
                if st is not None:
                    other.times.append(now)
                    other.cpu.append(st[2])
            roots = dict(self.roots)
            for pid, (_, start, cpu, rss) in table.items():
                self._seen(pid, start, cpu, rss, now, table, roots)

    def _seen(
        self,
        pid: int,
        start: int,
        cpu: float,
        rss: int,
        now: float,
        table: dict[int, tuple[int, int, float, int]],
        roots: dict[int, tuple[str, str]],
    ) -> None:
        """Record one sample of ``pid`` when it is in the tree (the module's group rule)."""
        p = self.procs.get((pid, start))
        if p is None:
            registered = _registered(pid, table, roots)
            if registered is None:
                return  # outside the tree
            cmd = cmdline(pid)
            if is_actor(cmd):
                group = "actors"
            elif pid in roots:
                group = roots[pid][0]
            else:
                group = "ray" if is_ray(cmd) else registered[1]
            p = self.procs[(pid, start)] = Proc(pid, group, cmd)
        elif p.group == "ray":  # an idle Ray worker becomes an actor: its title changes
            cmd = cmdline(pid)
            if is_actor(cmd):
                p.cmd, p.group = cmd, "actors"
        p.times.append(now)
        p.cpu.append(cpu)
        p.rss.append(rss)
        if self.threads and p.group == "actors":
            _threads(pid, p.threads)

    # -- reading ------------------------------------------------------------------------------
    def at(self, t: float, prefix: str = "") -> dict[str, float]:
        """CPU seconds per group at time ``t`` (monotonic clock), of the groups starting with
        ``prefix`` (and the ``groups`` given, at 0 when empty)."""
        out = dict.fromkeys((g for g in self.known if g.startswith(prefix)), 0.0)
        with self._lock:
            for p in self.procs.values():
                if p.group.startswith(prefix):
                    out[p.group] = out.get(p.group, 0.0) + p.cpu_at(t)
        return out

    def total(self) -> dict[str, float]:
        return self.at(float("inf"))

    def between(self, t0: float, t1: float, prefix: str = "") -> dict[str, float]:
        """CPU seconds per group over ``[t0, t1]`` (groups starting with ``prefix``)."""
        a, b = self.at(t0, prefix), self.at(t1, prefix)
        return {g: b[g] - a.get(g, 0.0) for g in b}

    def busy_between(self, t0: float, t1: float) -> float:
        """Busy CPU seconds of the whole machine over ``[t0, t1]``."""
        with self._lock:
            ts, vs = list(self.busy_t), list(self.busy)
        if not ts:
            return 0.0

        def at(t: float) -> float:
            return vs[0] if t < ts[0] else _interpolate(ts, vs, t)

        return at(t1) - at(t0)

    def machine(self, t0: float, t1: float) -> dict[str, float]:
        """Cores busy on average over ``[t0, t1]``: ``all`` (the whole machine), ``tree``
        (the root and its descendants), each ``also`` process by name, and ``others``
        (everything else: other users' work, the sampler itself); ``cores`` the machine's."""
        span = t1 - t0
        if span <= 0:
            return {}
        out = {"all": self.busy_between(t0, t1) / span}
        out["tree"] = sum(self.between(t0, t1).values()) / span
        for name, p in self.also.items():
            out[name] = (p.cpu_at(t1) - p.cpu_at(t0)) / span
        out["others"] = max(0.0, out["all"] - sum(v for k, v in out.items() if k != "all"))
        out["cores"] = float(os.cpu_count() or 1)
        return out

    def of_group(self, group: str) -> list[Proc]:
        with self._lock:
            return [p for p in self.procs.values() if p.group == group]

    def count(self, group: str) -> int:
        return len(self.of_group(group))

    def actor_threads(self) -> dict[str, float]:
        """CPU seconds of the actors' threads by name (summed over actors; whole run)."""
        out: dict[str, float] = {}
        for p in self.of_group("actors"):
            for name, cpu in p.threads.values():
                out[name] = out.get(name, 0.0) + cpu
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _registered(
    pid: int, table: dict[int, tuple[int, int, float, int]], roots: dict[int, tuple[str, str]]
) -> tuple[str, str] | None:
    """The registration of ``pid``'s nearest registered ancestor (itself included); None
    outside every registered tree."""
    for _ in range(MAX_DEPTH):
        if pid in roots:
            return roots[pid]
        if pid not in table:
            return None
        pid = table[pid][0]
    return None


# -- one command, measured -------------------------------------------------------------------
@dataclass(slots=True)
class Measured:
    """One command's run: wall time, exit status, output, peak RSS of its process tree."""

    argv: list[str]
    rc: int
    wall_s: float
    peak_tree_rss: int  #: highest sum of the tree's RSS over the 20 ms samples (bytes)
    maxrss: int  #: ru_maxrss of the waited process and its waited-for children (bytes)
    stdout: str
    stderr: str

    def to_dict(self) -> dict[str, Any]:
        return {"rc": self.rc, "wall_s": round(self.wall_s, 3),
                "peak_tree_rss_mb": round(self.peak_tree_rss / 2**20, 1),
                "maxrss_mb": round(self.maxrss / 2**20, 1)}  # fmt: skip


def tree_pids(root: int) -> list[int]:
    """``root`` and every process below it now."""
    table: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = read_stat(name)
            if st is not None:
                table[int(name)] = st[0]
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(c for c, pp in table.items() if pp == pid)
    return out


def run_measured(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    timeout_s: float = 600.0,
    interval: float = 0.02,
    sampler: TreeSampler | None = None,
    group: str = "tool",
) -> Measured:
    """Run ``argv`` (own session), sampling its tree's RSS every ``interval`` seconds; with a
    ``sampler``, its process is registered there as ``group``."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)  # fmt: skip
    if sampler is not None:
        sampler.register(proc.pid, group)
    out: dict[str, bytes] = {}

    def drain(name: str, stream: IO[bytes]) -> None:
        out[name] = stream.read()

    readers = [threading.Thread(target=drain, args=(n, s), daemon=True)
               for n, s in (("out", proc.stdout), ("err", proc.stderr))]  # fmt: skip
    for r in readers:
        r.start()
    peak, maxrss = _watch(proc, t0, timeout_s, interval)
    wall = time.monotonic() - t0
    for r in readers:
        r.join(timeout=10)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    if proc.returncode is None:  # reaped elsewhere
        proc.returncode = -1
        maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return Measured(argv, proc.returncode, wall, peak, maxrss,
                    out.get("out", b"").decode(errors="replace"),
                    out.get("err", b"").decode(errors="replace"))  # fmt: skip


def _watch(
    proc: subprocess.Popen[bytes], t0: float, timeout_s: float, interval: float
) -> tuple[int, int]:
    """(peak summed RSS of ``proc``'s tree, its ``ru_maxrss``) until it exits (reaped here;
    its process group killed past ``timeout_s``). The tree's pids are listed every 10th
    sample."""
    pids, n, peak, maxrss = [proc.pid], 0, 0, 0
    while True:
        try:
            wpid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:
            return peak, maxrss
        if wpid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return peak, usage.ru_maxrss * 1024
        if n % 10 == 0:
            pids = tree_pids(proc.pid)
        n += 1
        peak = max(peak, sum(st[3] for pid in pids if (st := read_stat(pid)) is not None))
        if time.monotonic() - t0 > timeout_s:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
        time.sleep(interval)
