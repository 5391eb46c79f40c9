"""Test helpers: start a simulated server, wait until it answers, stop it.

``running_simulator(**options)`` runs ``python -m regen simulate`` as a subprocess in its own
process group (a real server that a test can SIGKILL), forked from this process's fork server
(:mod:`regen.devkit.forkserver`) unless ``fork=False``; ``simulator_in_thread(**options)`` runs
the same server on an event loop in a background thread (cheaper to start, shares the GIL).
Options are the ``regen simulate`` flags with underscores (``max_running_requests=8``,
``fault_sequence="503,500"``, ``instant=True``): the field names of
:class:`regen.devkit.simulate.config.SimConfig` (see its ``from_flat``). The subprocess writes its
stderr (forked: its stdout too) to ``<tmp>/simulate.log``; its tail is in the error when it
fails to start. Owns a temporary directory per simulator (ready file, log), removed on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regen
from regen.core.errors import EndpointError, TemplateError
from regen.devkit.forkserver import Program, fork_or_none
from regen.devkit.procs import Process, kill_group, stop_group
from regen.devkit.simulate.config import SimConfig
from regen.devkit.simulate.server import serve
from regen.template.tokenizer import class_spec, load_tokenizer

#: seconds a simulator may take to start answering /health
START_TIMEOUT_S = 30.0

#: options of a speculating simulator with the reference serving flags (EAGLE3, 3 steps,
#: top-k 1, 4 draft tokens: CONTRACTS §2), for tests
EAGLE3_OPTIONS: dict[str, Any] = {
    "speculative_algorithm": "EAGLE3",
    "speculative_draft_model_path": "/drafts/k25-eagle3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
}


@dataclass(slots=True)
class RunningSimulator:
    """A started simulator: ``url`` is the OpenAI base URL (``.../v1``), ``base`` the root."""

    base: str
    process: Process | None = None
    log_path: Path | None = None
    _stop: Any = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"{self.base}/v1"

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    def get(self, path: str, timeout: float = 10.0) -> Any:
        """GET ``base + path`` and decode the JSON answer."""
        with urllib.request.urlopen(self.base + path, timeout=timeout) as r:
            data = r.read()
        return json.loads(data) if data else None

    def metrics_text(self, timeout: float = 10.0) -> str:
        """The server's ``/metrics`` page (SGLang's with ``enable_metrics``, or vLLM's)."""
        with urllib.request.urlopen(self.base + "/metrics", timeout=timeout) as r:
            return r.read().decode("utf-8")

    def stats(self, keys: bool = False) -> dict[str, Any]:
        """The server's /stats (with per-key and per-conversation counts when ``keys``)."""
        return self.get("/stats?keys=1" if keys else "/stats")

    def reset_stats(self) -> None:
        req = urllib.request.Request(self.base + "/stats/reset", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=10.0) as r:
            r.read()

    def kill(self) -> None:
        """SIGKILL the server's process group (subprocess simulators only)."""
        if self.process is not None:
            kill_group(self.process)


def with_tokenizer_class(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the ``tokenizer_class`` of their ``tokenizer`` resolved here (once per
    directory and process): each simulator then loads its tokenizer by that class, without
    AutoTokenizer's model config and torch (:mod:`regen.template.tokenizer`)."""
    tok = options.get("tokenizer")
    if tok is None or options.get("tokenizer_class"):
        return options
    path = Path(tok)
    try:
        stamp = (path / "tokenizer_config.json").stat().st_mtime_ns
    except OSError:
        return options  # the simulator says what is wrong with it
    return {**options, "tokenizer_class": _resolved_class(str(path.resolve()), stamp)}


@functools.lru_cache(maxsize=32)
def _resolved_class(path: str, stamp: int) -> str | None:
    """:func:`regen.template.tokenizer.class_spec` of the directory (``stamp``: its config's
    mtime, so an edited directory is resolved again)."""
    try:
        return class_spec(load_tokenizer(path, trust_remote_code=True))
    except TemplateError:
        return None  # the simulator loads it with AutoTokenizer, and says why it fails


def options_to_args(options: dict[str, Any]) -> list[str]:
    """``{"max_running_requests": 8, "instant": True}`` → ``["--max-running-requests", "8",
    "--instant"]`` (None is left out; False is ``--no-NAME`` for a switch on by default, else
    left out)."""

    args: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is False:
            f = SimConfig.model_fields.get(key)
            if f is not None and f.default is True:
                args.append("--no-" + key.replace("_", "-"))
            continue
        if value is None:
            continue
        if value is True:
            args.append(flag)
        else:
            args += [flag, str(value)]
    return args


def _wait_healthy(base: str, deadline: float, alive: Any) -> None:
    while time.monotonic() < deadline:
        if not alive():
            raise EndpointError("simulator exited before answering /health")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2.0) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise EndpointError(f"simulator at {base} did not answer /health in time")


#: the entry point ``python -m regen`` runs, and modules ``regen simulate`` imports when it
#: starts: a forked simulator has them already (:func:`launch_simulator`); not
#: ``monitor.render``, whose pyarrow starts threads when it loads (a fork server holding
#: threads does not fork)
ENTRY_POINT = ("regen.cli.main", "console")
PRELOAD = ("regen.devkit.commands.simulate", "regen.devkit.simulate.server")


def launch_simulator(
    cmd: list[str], env: dict[str, str], log_path: Path, fork: bool = True
) -> Process:
    """``cmd`` (``python -m regen simulate ...``) in a process group of its own, its output
    into ``log_path``: forked from this process's fork server (:mod:`regen.devkit.forkserver`),
    unless ``fork`` is False or the fork server cannot fork."""
    if fork:  # sys.argv as `python -m regen ARGS` sets it: the module's path, then ARGS
        main = str(Path(regen.__file__).with_name("__main__.py"))
        program = Program(Path(sys.executable), *ENTRY_POINT, PRELOAD)
        forked = fork_or_none(program, [main, *cmd[3:]], env, log_path)
        if forked is not None:
            return forked
    with log_path.open("wb") as log_file:
        return subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=log_file, start_new_session=True, env=env
        )


@contextlib.contextmanager
def running_simulator(
    *,
    start_timeout: float = START_TIMEOUT_S,
    env: dict[str, str] | None = None,
    fork: bool = True,
    **options: Any,
) -> Iterator[RunningSimulator]:
    """Start ``python -m regen simulate`` on a free loopback port; stop it on exit. ``fork``:
    forked from this process's fork server, which imported regen's simulator once (a start to
    ready 0.23-0.32 CPU-s instead of 0.8-1.0 here, 2026-12-07)."""
    with tempfile.TemporaryDirectory(prefix="regen-sim-") as tmp:
        ready = Path(tmp) / "ready"
        log_path = Path(tmp) / "simulate.log"
        options.setdefault("port", 0)
        cmd = [
            sys.executable,
            "-m",
            "regen",
            "--log-level",
            "WARNING",
            "simulate",
            "--ready-file",
            str(ready),
            *options_to_args(with_tokenizer_class(options)),
        ]
        proc = launch_simulator(cmd, {**os.environ, **(env or {})}, log_path, fork)
        sim = RunningSimulator(base="", process=proc, log_path=log_path)
        try:
            deadline = time.monotonic() + start_timeout
            while not ready.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = log_path.read_text(errors="replace")[-2000:]
                    raise EndpointError(f"simulator did not start ({' '.join(cmd)}):\n{tail}")
                time.sleep(0.02)
            sim.base = ready.read_text().strip().removesuffix("/v1")
            _wait_healthy(sim.base, deadline, lambda: proc.poll() is None)
            yield sim
        finally:
            stop_group(proc, timeout_s=5)


@contextlib.contextmanager
def simulator_in_thread(
    *, start_timeout: float = START_TIMEOUT_S, **options: Any
) -> Iterator[RunningSimulator]:
    """The same server on an event loop in a daemon thread of this process."""

    config = SimConfig.from_flat(options)
    loop = asyncio.new_event_loop()
    got: dict[str, Any] = {}
    started = threading.Event()

    async def main() -> None:
        ready: asyncio.Future[str] = loop.create_future()
        task = asyncio.ensure_future(serve(config, ready=ready))
        got["task"] = task
        await asyncio.wait((task, ready), return_when=asyncio.FIRST_COMPLETED)
        got["url"] = ready.result() if ready.done() else None
        started.set()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def target() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as e:  # reported to the caller below
            got["error"] = e
            started.set()
        finally:  # cancel what is left (e.g. a stalled handler) before closing the loop
            pending = asyncio.all_tasks(loop)
            for t in pending:
                t.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    thread = threading.Thread(target=target, name="regen-simulator", daemon=True)
    thread.start()
    try:
        if not started.wait(start_timeout) or not got.get("url"):
            raise EndpointError(f"in-thread simulator did not start: {got.get('error')!r}")
        sim = RunningSimulator(base=got["url"])
        _wait_healthy(sim.base, time.monotonic() + start_timeout, thread.is_alive)
        yield sim
    finally:
        task = got.get("task")
        if task is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)
        thread.join(timeout=10)
