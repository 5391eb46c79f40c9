"""Stopping a child's whole process group: grandchildren go with it, SIGTERM first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from regen.devkit.procs import kill_group, stop_group

#: a leader that ignores SIGTERM and starts a grandchild that does too
STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def start(code: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def wait_gone(pgid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not group_alive(pgid)


def test_stop_group_kills_what_ignores_sigterm_including_grandchildren() -> None:
    proc = start(STUBBORN)
    stop_group(proc, timeout_s=0.5)
    assert proc.returncode == -signal.SIGKILL  # SIGTERM was ignored: it was escalated
    assert wait_gone(proc.pid)


def test_stop_group_lets_a_polite_process_exit_on_sigterm() -> None:
    proc = start("import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    stop_group(proc, timeout_s=10)
    assert proc.returncode == -15  # SIGTERM, not SIGKILL
    assert wait_gone(proc.pid)


def test_kill_group_on_an_exited_leader_is_harmless() -> None:
    proc = start("print('ready', flush=True)\n")
    proc.wait(timeout=10)
    kill_group(proc)
    assert proc.returncode == 0
