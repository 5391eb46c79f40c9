"""CPU and memory of every process the rehearsal starts, read from ``/proc`` (issue 32).

:class:`ProcSampler` walks the descendants of this process every ``interval`` seconds in a
thread (this process is made a child subreaper first, so an orphan stays in the tree) and keeps,
per process (keyed by pid and start time), its user + system CPU and its resident set size
over time (``/proc/PID/stat`` fields 14, 15 and 24). Each process belongs to the group of its
nearest ancestor the rehearsal registered (:meth:`ProcSampler.register`: ``sim:3``,
``driver:1``, ``ray``, ``tool:export``, ...), except Ray's actor processes (``ray::WorkerActor``
/ ``ray::regen-...`` titles), which are ``actors``; processes the rehearsal did not register
are ``harness`` (this process and its helpers), except Ray's daemons, which ``ray start``
re-parents here (``ray``: a command line in Ray's package, or a ``ray::`` title). The
machine's busy CPU (``/proc/stat``) is sampled on the same ticks, so a window's ``others``
(other users of this shared machine) is the machine minus the tree.

:func:`run_measured` runs one command with its process tree sampled every 20 ms: wall time,
exit status, output and the peak of the tree's summed RSS (and ``ru_maxrss`` of the largest
process, from ``wait4``). Owns no files.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import resource
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
ACTOR_TITLES = ("ray::WorkerActor", "ray::regen-")
#: a part of the command line of every Ray daemon and worker (Ray's own package path)
RAY_PATH = "/site-packages/ray/"


def become_subreaper() -> None:
    """Orphaned descendants of this process are re-parented to it (Linux), not to init."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
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
    """CPU seconds all cores of the machine have been busy since boot."""
    with open("/proc/stat", "rb") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / CLK_TCK


@dataclass(slots=True)
class Proc:
    pid: int
    group: str
    cmd: str
    times: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)

    def cpu_at(self, t: float) -> float:
        """CPU seconds at ``t`` (0 before the first sample, the last value after)."""
        if not self.times or t < self.times[0]:
            return 0.0
        i = bisect.bisect_right(self.times, t)
        if i >= len(self.times):
            return self.cpu[-1]
        t0, t1, c0, c1 = self.times[i - 1], self.times[i], self.cpu[i - 1], self.cpu[i]
        return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1

    def rss_at(self, t: float) -> int | None:
        """RSS of the last sample at or before ``t`` (None before the first or after the end)."""
        i = bisect.bisect_right(self.times, t)
        if i == 0 or (i == len(self.times) and t > self.times[-1] + 5.0):
            return None
        return self.rss[i - 1]


class ProcSampler:
    """Samples CPU and RSS of this process's descendants, by group, in a thread."""

    def __init__(self, interval: float = 1.0) -> None:
        self.root = os.getpid()
        self.interval = interval
        self.procs: dict[tuple[int, int], Proc] = {}
        self.roots: dict[int, str] = {}  #: registered pid -> group
        self.busy_t: list[float] = []
        self.busy: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rehearsal-procs", daemon=True)

    def register(self, pid: int, group: str) -> None:
        """Every descendant of ``pid`` (and itself) belongs to ``group``."""
        with self._lock:
            self.roots[pid] = group

    def start(self) -> ProcSampler:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        now = time.monotonic()
        table: dict[int, tuple[int, int, float, int]] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                st = read_stat(name)
                if st is not None:
                    table[int(name)] = st
        with self._lock:
            roots = dict(self.roots)
            self.busy_t.append(now)
            self.busy.append(machine_busy())
            for pid, (_, start, cpu, rss) in table.items():
                group = self._group(pid, table, roots)
                if group is None:
                    continue
                key = (pid, start)
                p = self.procs.get(key)
                if p is None:
                    cmd = cmdline(pid)
                    if cmd.startswith(ACTOR_TITLES):
                        group = "actors"
                    elif group == "harness" and (cmd.startswith("ray::") or RAY_PATH in cmd):
                        group = "ray"  # Ray's daemons, re-parented here by `ray start`
                    p = self.procs[key] = Proc(pid, group, cmd)
                elif p.group == "ray" and not p.cmd.startswith(ACTOR_TITLES):
                    cmd = cmdline(pid)  # an idle Ray worker becomes an actor: title changes
                    if cmd.startswith(ACTOR_TITLES):
                        p.cmd, p.group = cmd, "actors"
                p.times.append(now)
                p.cpu.append(cpu)
                p.rss.append(rss)

    def _group(
        self, pid: int, table: dict[int, tuple[int, int, float, int]], roots: dict[int, str]
    ) -> str | None:
        """The group of ``pid``'s nearest registered ancestor; ``harness`` for this process's
        other descendants; None outside this process's tree."""
        seen = 0
        while pid in table and seen < 64:
            if pid in roots:
                return roots[pid]
            if pid == self.root:
                return "harness"
            pid = table[pid][0]
            seen += 1
        return None

    # -- reading ------------------------------------------------------------------------------
    def groups(self) -> list[str]:
        return sorted({p.group for p in self.procs.values()})

    def cpu(self, t0: float, t1: float, prefix: str = "") -> dict[str, float]:
        """CPU seconds per group over ``[t0, t1]`` (groups starting with ``prefix``)."""
        out: dict[str, float] = {}
        with self._lock:
            for p in self.procs.values():
                if p.group.startswith(prefix):
                    out[p.group] = out.get(p.group, 0.0) + p.cpu_at(t1) - p.cpu_at(t0)
        return out

    def machine(self, t0: float, t1: float) -> float:
        """Busy CPU seconds of the whole machine over ``[t0, t1]``."""
        with self._lock:
            ts, vs = list(self.busy_t), list(self.busy)

        def at(t: float) -> float:
            i = bisect.bisect_right(ts, t)
            if i == 0:
                return vs[0]
            if i >= len(ts):
                return vs[-1]
            a, b = ts[i - 1], ts[i]
            return vs[i - 1] + (vs[i] - vs[i - 1]) * (t - a) / (b - a) if b > a else vs[i]

        return at(t1) - at(t0) if ts else 0.0

    def live(self, group: str) -> list[Proc]:
        """Processes of ``group`` seen in the last sample."""
        with self._lock:
            last = max((p.times[-1] for p in self.procs.values() if p.times), default=0.0)
            return [p for p in self.procs.values() if p.group == group and p.times
                    and p.times[-1] >= last - 1e-9]  # fmt: skip

    def of_group(self, group: str) -> list[Proc]:
        with self._lock:
            return [p for p in self.procs.values() if p.group == group]

    def rss_series(self, groups: Iterable[str]) -> list[tuple[float, int]]:
        """(time, summed RSS) of the processes of ``groups`` at every sample."""
        wanted = set(groups)
        acc: dict[float, int] = {}
        with self._lock:
            for p in self.procs.values():
                if p.group in wanted:
                    for t, r in zip(p.times, p.rss, strict=True):
                        acc[t] = acc.get(t, 0) + r
        return sorted(acc.items())


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


def _tree(root: int) -> list[int]:
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
    sampler: ProcSampler | None = None,
    group: str = "tool",
) -> Measured:
    """Run ``argv`` (own session), sampling its tree's RSS every ``interval`` seconds."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)  # fmt: skip
    if sampler is not None:
        sampler.register(proc.pid, group)
    peak = 0
    out: dict[str, bytes] = {}

    def drain(name: str, stream: Any) -> None:
        out[name] = stream.read()

    readers = [threading.Thread(target=drain, args=(n, s), daemon=True)
               for n, s in (("out", proc.stdout), ("err", proc.stderr))]  # fmt: skip
    for r in readers:
        r.start()
    pids = [proc.pid]
    n = 0
    maxrss = 0
    while True:
        try:
            wpid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:
            break
        if wpid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            maxrss = usage.ru_maxrss * 1024
            break
        if n % 10 == 0:
            pids = _tree(proc.pid)
        n += 1
        total = 0
        for pid in pids:
            st = read_stat(pid)
            if st is not None:
                total += st[3]
        peak = max(peak, total)
        if time.monotonic() - t0 > timeout_s:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
        time.sleep(interval)
    wall = time.monotonic() - t0
    for r in readers:
        r.join(timeout=10)
    if proc.returncode is None:  # reaped elsewhere
        proc.returncode = -1
        maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return Measured(argv, proc.returncode, wall, peak, maxrss,
                    out.get("out", b"").decode(errors="replace"),
                    out.get("err", b"").decode(errors="replace"))  # fmt: skip
