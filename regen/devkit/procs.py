"""Child processes started in a process group of their own (servers, Ray nodes): stopping
the whole group, so no grandchild outlives the test or command that started it. Owns no files."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Protocol


class Process(Protocol):
    """What stopping a group needs of its leader: ``subprocess.Popen``'s ``pid``, ``poll`` and
    ``wait`` (also :class:`regen.devkit.forkserver.Forked`)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def kill_group(proc: Process, timeout_s: float = 10.0) -> None:
    """SIGKILL the process group led by ``proc`` (a group may outlive its leader), reap the
    leader, and wait (up to ``timeout_s``) until no process of the group is left: a killed
    process takes a moment to exit (a large one on a busy machine, longer), and a caller that
    reuses its port or asserts it is gone must not see it."""
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout_s)
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def group_alive(pgid: int) -> bool:
    """Whether a live process of the group ``pgid`` is left. A zombie is not: killed, it waits
    for whoever adopted it to reap it, which it cannot stop (on Linux, read from /proc;
    elsewhere any process of the group counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False  # no process of the group at all: no need to look further
    except PermissionError:  # one we may not signal: it is there
        pass
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():  # some are left: are they all zombies?
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone while we looked
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def stop_group(proc: Process, timeout_s: float = 10.0) -> None:
    """SIGTERM the group, wait up to ``timeout_s`` for its leader, then SIGKILL what is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)
    kill_group(proc, timeout_s)
