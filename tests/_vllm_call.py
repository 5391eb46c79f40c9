"""Run a vLLM-side helper script's ``handle(job)`` in the vLLM environment (``.venv-vllm``):
one long-lived ``_vllm_worker.py`` process per test process, started on first use and reused by
every module, so vLLM is imported once and not once per script launch (each import costs about
ten CPU-seconds).

:func:`vllm_call` skips the test where the vLLM environment is missing, as
``_vllm_env.vllm_python_or_skip`` does. The worker runs with ``HF_HUB_OFFLINE=1`` and
``TRANSFORMERS_OFFLINE=1``; its stderr (vLLM's logs) goes to an unnamed temporary file whose
tail an error quotes. A reply that does not come within the call's timeout kills the worker; a
worker found dead is started again, once per call. At exit its stdin is closed and it is
waited for (then killed); a worker whose test process ends without that exits at EOF anyway.

``REGEN_VLLM_WORKER_TRACE``, where set, names a file that gets a line per worker start, call
and close (how many processes a run started, and what they ran).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_vllm_worker.py"
if str(HERE / "engines") not in sys.path:
    sys.path.insert(0, str(HERE / "engines"))

from _vllm_env import vllm_python_or_skip  # noqa: E402

#: seconds a call may take by default (the worker's first one imports vLLM: about ten)
TIMEOUT_S = 240.0
#: seconds the worker gets to exit once its stdin is closed
CLOSE_TIMEOUT_S = 10.0


class VllmWorkerError(RuntimeError):
    """The worker died, timed out, or the helper raised (the message holds its traceback)."""


class _Worker:
    def __init__(self, py: Path) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        #: the worker's stderr: a file without a name, gone with the last process holding it
        self.log: IO[bytes] = tempfile.TemporaryFile(prefix="regen-vllm-worker-")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [str(py), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, env=env,
        )  # fmt: skip
        self.buffer = b""
        _trace(f"start pid={self.proc.pid} parent={os.getpid()}")
        print(f"[vllm worker] started pid {self.proc.pid}", file=sys.stderr)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line)
        self.proc.stdin.flush()

    def receive(self, timeout_s: float) -> bytes | None:
        """The next reply line; None at EOF (the worker died); TimeoutError past the timeout."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def log_tail(self, n: int = 4000) -> str:
        """The end of the worker's stderr (read where it is: the worker shares the offset)."""
        fd = self.log.fileno()
        size = os.fstat(fd).st_size
        return os.pread(fd, n, max(0, size - n)).decode(errors="replace")

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Close stdin (the worker exits at EOF), wait, kill if it does not; drop the log."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()
        _trace(f"closed pid={self.proc.pid} rc={self.proc.returncode}")


_LOCK = threading.Lock()
_worker: _Worker | None = None


def _trace(text: str) -> None:
    path = os.environ.get("REGEN_VLLM_WORKER_TRACE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{text}\n")


def _close() -> None:
    global _worker
    with _LOCK:
        if _worker is not None:
            _worker.close()
            _worker = None


atexit.register(_close)


def vllm_call(
    script: Path,
    job: Any,
    *,
    timeout_s: float = TIMEOUT_S,
    env: dict[str, str | None] | None = None,
) -> Any:
    """``handle(job)`` of the helper ``script``, run by the vLLM environment's worker (skips
    when that environment is missing): the JSON value it returned. ``env``: variables set (or,
    given None, unset) for this call only. VllmWorkerError where the helper raised, the worker
    died twice, or no reply came within ``timeout_s`` (the worker is then killed)."""
    global _worker
    py = vllm_python_or_skip()
    request = {"script": str(Path(script).resolve()), "job": job}
    if env:
        request["env"] = env
    line = json.dumps(request).encode() + b"\n"
    with _LOCK:
        _trace(f"call pid={os.getpid()} script={Path(script).name}")
        for attempt in range(2):
            if _worker is None or not _worker.alive():
                if _worker is not None:
                    _worker.close(timeout_s=0)
                _worker = _Worker(py)
            worker = _worker
            try:
                worker.send(line)
                reply = worker.receive(timeout_s)
            except BrokenPipeError:
                reply = None
            except TimeoutError:
                tail = worker.log_tail()
                worker.close(timeout_s=0)
                _worker = None
                raise VllmWorkerError(
                    f"no reply from the vLLM worker in {timeout_s:.0f} s for {script}; "
                    f"its log ends:\n{tail}"
                ) from None
            if reply is not None:
                break
            tail = worker.log_tail()
            worker.close(timeout_s=0)
            _worker = None
            if attempt:
                raise VllmWorkerError(
                    f"the vLLM worker died running {script}; its log ends:\n{tail}"
                )
    got = json.loads(reply)
    if "error" in got:
        raise VllmWorkerError(f"{script} raised in the vLLM worker:\n{got['error']}")
    return got["result"]
