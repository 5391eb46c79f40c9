"""``LocalServer``: a real OpenAI-compatible server run as a local process (the base of
:class:`regen.devkit.servers.transformers.TransformersServer` and
:class:`regen.devkit.servers.vllm.VllmServer`).

The life of one: a free loopback port unless one is given; the command (the subclass's) in a
process group of its own; a bounded wait until ``GET /health`` answers 200 and
``GET /v1/models`` lists :attr:`LocalServer.listed_name` (the server exiting first is an
error naming its exit code); on stop, SIGTERM to the whole group, then SIGKILL
(regen.devkit.procs.stop_group), so no grandchild outlives the command or test that started it.

Owns one file when ``log_path`` is given: the server's combined stdout/stderr (appended).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from regen.core.errors import EndpointError
from regen.devkit.procs import Process, stop_group

log = logging.getLogger(__name__)

#: variables every server process gets unless the caller's environment or ``env`` sets them
BASE_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LocalServer:
    """One server process: ``with Server(...) as srv: srv.url`` → ``http://127.0.0.1:P/v1``.

    A subclass names itself (:attr:`label`), says what it serves (:attr:`listed_name`), its
    command (:meth:`command`) and the environment it needs (``env_defaults``)."""

    #: the server's name in messages
    label = "server"
    #: the readiness probe's HTTP timeout and the pause between probes, seconds
    probe_timeout_s = 2.0
    probe_every_s = 0.25
    #: how long stop() waits after SIGTERM before SIGKILL, seconds
    stop_timeout_s = 10.0

    def __init__(
        self,
        model_dir: str | Path,
        *,
        host: str,
        port: int | None,
        startup_timeout_s: float,
        log_path: str | Path | None,
        env: dict[str, str] | None,
    ) -> None:
        self.model_dir = Path(model_dir).resolve()
        self.host = host
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(log_path) if log_path is not None else None
        self.env = env
        #: variables set for the process unless the caller's environment or ``env`` sets them
        self.env_defaults = dict(BASE_ENV)
        self._proc: Process | None = None
        self._log: IO[bytes] | None = None
        #: seconds from the start to the first healthy answer (None: not started)
        self.start_s: float | None = None

    @property
    def listed_name(self) -> str:
        """The model id the server lists in /v1/models and expects in requests."""
        return str(self.model_dir)

    @property
    def root(self) -> str:
        if self.port is None:
            raise EndpointError(f"{self.label} not started")
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """Base URL for OpenAI clients (includes /v1)."""
        return f"{self.root}/v1"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> Self:
        """Start the process and wait until it serves (a no-op when it runs already)."""
        if self._proc is not None:
            return self
        if not (self.model_dir / "config.json").exists():
            raise EndpointError(f"{self.model_dir}: not a model folder (no config.json)")
        if self.port is None:
            self.port = free_port(self.host)
        env = {**self.env_defaults, **os.environ, **(self.env or {})}
        out: Any = subprocess.DEVNULL
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
            out = self._log
        cmd = self.command()
        log.info("starting %s", " ".join(cmd))
        t0 = time.monotonic()
        self._proc = self.launch(cmd, out, env)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - t0
        log.info(
            "%s ready at %s after %.0f s (pid %d)", self.label, self.url, self.start_s, self.pid
        )
        return self

    def launch(self, cmd: list[str], out: Any, env: dict[str, str]) -> Process:
        """Start ``cmd`` in a process group of its own, its output into ``out``."""
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def _wait_ready(self) -> None:
        import httpx2

        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx2.Client(timeout=self.probe_timeout_s) as http:
            while time.monotonic() < deadline:
                code = self._proc.poll()
                if code is not None:
                    raise EndpointError(
                        f"{self.label} exited with code {code} before it was ready"
                        + self._log_hint()
                    )
                with contextlib.suppress(httpx2.HTTPError, ValueError):
                    if http.get(f"{self.root}/health").status_code == 200:
                        models = http.get(f"{self.url}/models").json().get("data") or []
                        if any(m.get("id") == self.listed_name for m in models):
                            return
                time.sleep(self.probe_every_s)
        raise EndpointError(
            f"{self.label} not ready after {self.startup_timeout_s:.0f} s" + self._log_hint()
        )

    def _log_hint(self) -> str:
        return f" (log: {self.log_path})" if self.log_path is not None else ""

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the server's whole process group (SIGTERM, then SIGKILL after ``timeout_s``,
        by default :attr:`stop_timeout_s`)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_group(proc, self.stop_timeout_s if timeout_s is None else timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
