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
  regen.devkit.demo_target); without one the special tokens are dropped from the text;
- parsed tool calls get the ids ``{request id}_tool_call_{i}``, not Kimi's
  ``functions.{name}:{i}``.

The process's life (port, readiness, stop, log file) is regen.devkit.servers.local.LocalServer's.

Owns one file when ``log_path`` is given: the server's combined stdout/stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path

from regen.devkit.servers.local import LocalServer, free_port

__all__ = ["CB_ARGS", "TransformersServer", "free_port"]

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


class TransformersServer(LocalServer):
    """``with TransformersServer(model_dir) as srv: srv.url`` → ``http://127.0.0.1:P/v1``."""

    label = "transformers serve"

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
        super().__init__(
            model_dir,
            host=host,
            port=port,
            startup_timeout_s=startup_timeout_s,
            log_path=log_path,
            env=env,
        )
        self.extra_args = extra_args

    @property
    def model_name(self) -> str:
        """The model id the server lists in /v1/models and expects in requests (the model
        folder's absolute path, as given on the command line)."""
        return self.listed_name

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
