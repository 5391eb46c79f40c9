"""Stopping a child's whole process group: grandchildren go with it, SIGTERM first."""

from __future__ import annotations

import signal
import subprocess
import sys

from regen.devkit.procs import group_alive, kill_group, stop_group

#: a leader that ignores SIGTERM and starts a grandchild that does too
STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def start(code: str) -> subprocess.Popen[str]:
    """The child, once it said ready (a context manager: its pipe is closed on exit)."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_stop_group_kills_what_ignores_sigterm_including_grandchildren() -> None:
    with start(STUBBORN) as proc:
        stop_group(proc, timeout_s=0.5)
    assert proc.returncode == -signal.SIGKILL  # SIGTERM was ignored: it was escalated
    assert not group_alive(proc.pid)  # gone when stop_group returns, grandchild included


def test_stop_group_lets_a_polite_process_exit_on_sigterm() -> None:
    with start("import time\nprint('ready', flush=True)\ntime.sleep(60)\n") as proc:
        stop_group(proc, timeout_s=10)
    assert proc.returncode == -15  # SIGTERM, not SIGKILL
    assert not group_alive(proc.pid)  # gone when stop_group returns, grandchild included


def test_kill_group_on_an_exited_leader_is_harmless() -> None:
    with start("print('ready', flush=True)\n") as proc:
        proc.wait(timeout=10)
        kill_group(proc)
    assert proc.returncode == 0
