"""``TransformersServer``: a real local OpenAI-compatible server (``transformers serve``).

Starts ``transformers serve <model_dir> --host 127.0.0.1 --port P --device cpu
--continuous-batching --cb-num-blocks 256 --cb-block-size 32 --cb-max-batch-tokens 2048`` as a
subprocess in its own process group on a free loopback port, waits (bounded) until
``GET /health`` and ``GET /v1/models`` answer, and stops the whole group on exit.

What this server does (transformers 5.x, checked against the demo target):
- ``/v1/models`` lists exactly one id, the model argument as given on the command line (we
  pass the absolute path; :attr:`model_name`), and requests naming another model get HTTP 400;
- the prompt is rendered by the tokenizer's own ``apply_chat_template`` with
  ``add_generation_prompt=True``, ``tools`` and the request's ``chat_template_kwargs``
  (they are honoured: ``{"thinking": false}`` makes the prompt one token longer);
- streaming usage comes on the chunk that carries ``finish_reason`` (``stream_options`` is
  ignored), and the stream ends without ``data: [DONE]``;
- request fields outside its schema (``top_k``, ``return_token_ids`` ...) are rejected with
  HTTP 422; ``reasoning_content`` and tool calls are only split out when the tokenizer has a
  ``response_template`` (the demo target's has one for the Kimi format,
  regen.serving.demo_target); without one the special tokens are dropped from the text;
- parsed tool calls get the ids ``{request id}_tool_call_{i}``, not Kimi's
  ``functions.{name}:{i}``.

Owns one file when ``log_path`` is given: the server's combined stdout/stderr.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from regen.errors import EndpointError
from regen.procs import stop_group

log = logging.getLogger(__name__)

#: the continuous-batching settings the demo and tests run with (small, CPU-friendly)
CB_ARGS = (
    "--continuous-batching",
    "--cb-num-blocks",
    "256",
    "--cb-block-size",
    "32",
    "--cb-max-batch-tokens",
    "2048",
)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class TransformersServer:
    """``with TransformersServer(model_dir) as srv: srv.url`` → ``http://127.0.0.1:P/v1``."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout_s: float = 180.0,
        log_path: str | Path | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.model_dir = Path(model_dir).resolve()
        self.host = host
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(log_path) if log_path is not None else None
        self.extra_args = extra_args
        self.env = env
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def model_name(self) -> str:
        """The model id the server lists in /v1/models and expects in requests."""
        return str(self.model_dir)

    @property
    def root(self) -> str:
        if self.port is None:
            raise EndpointError("server not started")
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """Base URL for OpenAI clients (includes /v1)."""
        return f"{self.root}/v1"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def command(self) -> list[str]:
        exe = Path(sys.executable).parent / "transformers"
        prog = (
            [str(exe)]
            if exe.exists()
            else [sys.executable, "-c", "from transformers.cli.transformers import main; main()"]
        )
        return [
            *prog,
            "serve",
            self.model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--device",
            "cpu",
            *CB_ARGS,
            *self.extra_args,
        ]

    def start(self) -> TransformersServer:
        if self._proc is not None:
            return self
        if not (self.model_dir / "config.json").exists():
            raise EndpointError(f"{self.model_dir}: not a model folder (no config.json)")
        if self.port is None:
            self.port = free_port(self.host)
        env = {**os.environ, **(self.env or {})}
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.setdefault("HF_HUB_OFFLINE", "1")
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
            out: Any = self._log
        else:
            out = subprocess.DEVNULL
        cmd = self.command()
        log.info("starting %s", " ".join(cmd))
        self._proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        log.info("transformers serve ready at %s (pid %d)", self.url, self._proc.pid)
        return self

    def _wait_ready(self) -> None:
        import httpx2

        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx2.Client(timeout=2.0) as http:
            while time.monotonic() < deadline:
                code = self._proc.poll()
                if code is not None:
                    raise EndpointError(
                        f"transformers serve exited with code {code} before it was ready"
                        + self._log_hint()
                    )
                with contextlib.suppress(httpx2.HTTPError):
                    if http.get(f"{self.root}/health").status_code == 200:
                        models = http.get(f"{self.url}/models").json().get("data") or []
                        if any(m.get("id") == self.model_name for m in models):
                            return
                time.sleep(0.25)
        raise EndpointError(
            f"transformers serve not ready after {self.startup_timeout_s:.0f}s" + self._log_hint()
        )

    def _log_hint(self) -> str:
        return f" (log: {self.log_path})" if self.log_path is not None else ""

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server's whole process group (SIGTERM, then SIGKILL after ``timeout_s``)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_group(proc, timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> TransformersServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
