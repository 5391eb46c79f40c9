"""Child processes started in a process group of their own (servers, Ray nodes): stopping
the whole group, so no grandchild outlives the test or command that started it. Owns no files."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any


def kill_group(proc: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    """SIGKILL the process group led by ``proc`` (a group may outlive its leader) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout_s)


def stop_group(proc: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    """SIGTERM the group, wait up to ``timeout_s`` for its leader, then SIGKILL what is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)
    kill_group(proc, timeout_s)
