"""``ForkServer``: an interpreter (of this environment or another) that imported a server's
modules once and forks one process per server from there: vLLM's API servers
(:class:`regen.devkit.servers.vllm.VllmServer`: ~13 of the ~27 CPU-seconds of a start on this
machine are the API server's imports) and ``regen simulate``
(:func:`regen.devkit.simulate.testing.running_simulator`). Owns no named files: each forked
server writes the log its request names, and the fork server's own output goes to an anonymous
temporary file.

The fork server is ``PYTHON -c SOURCE MODULE ATTR SETUP [PRELOAD...]``: it moves its control
pipe off stdout, imports ``MODULE`` (and the ``PRELOAD`` modules the entry point imports when it
runs), runs ``SETUP`` (Python source, often empty: what every forked process inherits, e.g.
:data:`regen.devkit.servers.vllm.ENGINE_CORE_FORK`), then reads one JSON request a line on
stdin (``argv``, ``env``, ``cwd``, ``log``) and answers each with the forked process's pid.
The forked process starts a session of its own (its process group is its pid:
:func:`regen.devkit.procs.stop_group` stops it as it stops a ``start_new_session`` child),
points stdin at /dev/null and stdout and stderr at the log,
takes the request's environment, working directory and ``sys.argv``, and runs ``MODULE.ATTR()``;
its exit code is what a ``python`` running that entry point would exit with (1 when it fails
before the entry point: a log it cannot open, a directory gone). The fork server reaps what it
forked and keeps each exit code for :class:`Forked` (an ``exit_of`` request). A request it
cannot carry out (a failed fork) is answered with an error, and it goes on; what it prints
itself is kept in a file of its own, logged with its exit code if it ever stops answering
(then the request is an ``OSError``, and the next request starts another fork server).

Only what reads its settings after the import may run this way: the fork server starts with
the first request's environment, and a request whose environment differs in a variable read at
load time (:data:`LOAD_TIME`) gets a fork server of its own (:func:`fork_server`). The fork
server runs OpenMP on one thread (:data:`FORK_ENV`) and forks only while it holds no thread but
its own (otherwise every request is refused, and the caller starts a process of its own); what
it forked stays in its own group when it stops.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: the fork server's program (``python -c SOURCE MODULE ATTR SETUP [PRELOAD...]``)
SOURCE = r"""
import json, os, signal, sys, traceback
ctl = os.fdopen(os.dup(1), "w", buffering=1)
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 1)
module, attr, setup, *preload = sys.argv[1:]
entry = getattr(__import__(module, fromlist=[attr]), attr)
for name in preload:
    __import__(name)
exec(setup, {})
threads = len(os.listdir("/proc/self/task"))
if threads > 1:  # a fork would hold none of them: refuse to fork at all
    for line in sys.stdin:
        ctl.write(json.dumps({"error": f"{threads} threads after the import"}) + "\n")
    sys.exit(0)
exits = {}
def reap(*_):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        exits[pid] = os.waitstatus_to_exitcode(status)
def child(req):
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    out = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    ctl.close()
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    sys.argv = req["argv"]
    try:
        entry()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0
signal.signal(signal.SIGCHLD, reap)
for line in sys.stdin:
    try:
        req = json.loads(line)
        if "exit_of" in req:
            reap()
            answer = {"code": exits.get(req["exit_of"])}
        else:
            pid = os.fork()
            if pid == 0:  # the forked process: never back into this loop
                code = 1
                try:
                    code = child(req)
                except BaseException:
                    traceback.print_exc()
                try:
                    import atexit
                    atexit._run_exitfuncs()
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
            answer = {"pid": pid}
    except Exception as e:  # this request fails, the fork server goes on
        traceback.print_exc()
        answer = {"error": f"{type(e).__name__}: {e}"}
    ctl.write(json.dumps(answer) + "\n")
"""

#: variables read when the interpreter or the C library loads: a request that differs in one
#: of them from a fork server's own needs another fork server
LOAD_TIME = ("PYTHON", "LD_", "MALLOC_")
#: the fork server's own OpenMP: one thread, so that it holds no thread but its own when it
#: forks (an API server computes nothing; the engine cores it starts take the request's)
FORK_ENV = {"OMP_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Program:
    """What a fork server runs (module docstring): ``python``, the entry point
    ``module.attr`` its forks call, the modules it imports ahead (``preload``) and ``setup``."""

    python: Path
    module: str
    attr: str
    preload: tuple[str, ...] = ()
    setup: str = ""


class ForkServer:
    """One fork server process (module docstring)."""

    def __init__(self, program: Program, env: dict[str, str]) -> None:
        self.env = {**env, **FORK_ENV}
        self._lock = threading.Lock()
        # what the fork server itself says (a request it failed, its own end), for the error
        self._said = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        self._proc = subprocess.Popen(
            [
                str(program.python),
                "-c",
                SOURCE,
                program.module,
                program.attr,
                program.setup,
                *program.preload,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._said,
            env=self.env,
            start_new_session=True,
            text=True,
        )

    def fits(self, env: dict[str, str]) -> bool:
        """Whether a process with ``env`` may be forked from here (same load-time variables)."""

        def load_time(e: dict[str, str]) -> dict[str, str]:
            return {k: v for k, v in e.items() if k.startswith(LOAD_TIME)}

        return self.alive() and load_time(env) == load_time(self.env)

    def alive(self) -> bool:
        return self._proc.poll() is None

    def _ask(self, request: dict[str, object]) -> dict[str, object]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with self._lock:
            line = ""
            with contextlib.suppress(OSError, ValueError):  # a pipe it closed, or we did
                self._proc.stdin.write(json.dumps(request) + "\n")
                self._proc.stdin.flush()
                line = self._proc.stdout.readline()
            if not line:
                raise OSError(self._gone())
        answer: dict[str, object] = json.loads(line)
        return answer

    def _gone(self) -> str:
        """Stop what is left of a fork server that stopped answering; why, for the error."""
        self._stop()
        why = f"the fork server exited with code {self._proc.returncode}"
        if not self._said.closed:  # said once, when it was found gone
            self._said.seek(0, os.SEEK_END)
            self._said.seek(max(0, self._said.tell() - 2000))
            said = self._said.read().decode(errors="replace").strip()
            self._said.close()
            log.warning("%s; it said: %s", why, said or "nothing")
        return why

    def spawn(self, argv: list[str], env: dict[str, str], log_path: Path) -> Forked:
        """Fork one process running the entry point with ``argv`` (``sys.argv``), ``env`` and
        its output appended to ``log_path``."""
        answer = self._ask({"argv": argv, "env": env, "cwd": os.getcwd(), "log": str(log_path)})
        if "error" in answer:
            raise OSError(f"the fork server does not fork: {answer['error']}")
        pid = answer["pid"]
        assert isinstance(pid, int)
        return Forked(pid, self)

    def exit_code(self, pid: int) -> int | None:
        """The exit code of a process forked here, None while it runs (-9 when the fork server
        is gone, which took the code with it)."""
        if self.alive():
            with contextlib.suppress(OSError):
                code = self._ask({"exit_of": pid})["code"]
                return code if isinstance(code, int) else None
        return None if _running(pid) else -9

    def close(self) -> None:
        """Stop the fork server (what it forked goes on: each is stopped by its own group)."""
        self._stop()
        self._said.close()

    def _stop(self) -> None:
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):  # gone already, with a request left unsent
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


class Forked:
    """A process a :class:`ForkServer` forked, with the part of ``subprocess.Popen`` that
    :func:`regen.devkit.procs.stop_group` and the servers use (``pid``, ``poll``, ``wait``)."""

    def __init__(self, pid: int, server: ForkServer) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._server = server

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.05)
        return code


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rfind(")") + 2 :].split()[0] not in ("Z", "X")


_SERVERS: dict[Program, list[ForkServer]] = {}
_SERVERS_LOCK = threading.Lock()


def fork_server(program: Program, env: dict[str, str]) -> ForkServer:
    """This process's fork server of ``program`` whose load-time variables are ``env``'s,
    started on first use and stopped when this process exits."""
    with _SERVERS_LOCK:
        servers = _SERVERS.setdefault(program, [])
        for server in servers:
            if server.fits(env):
                return server
        log.info("starting a fork server for %s.%s (%s)", program.module, program.attr,
                 program.python)  # fmt: skip
        server = ForkServer(program, env)
        servers.append(server)
        return server


def fork_or_none(
    program: Program, argv: list[str], env: dict[str, str], log_path: Path
) -> Forked | None:
    """``program``'s entry point with ``argv``, ``env`` and its output appended to
    ``log_path``, forked from this process's fork server (:func:`fork_server`); None, logged,
    when that fork server cannot fork (the caller then starts a process of its own)."""
    server = fork_server(program, env)
    try:
        return server.spawn(argv, env, log_path)
    except OSError as e:
        log.warning("%s.%s not forked (%s): started as a process of its own", program.module,
                    program.attr, e)  # fmt: skip
        return None


@atexit.register
def close_all() -> None:
    """Stop every fork server this process started (at its exit too)."""
    with _SERVERS_LOCK:
        for servers in _SERVERS.values():
            for server in servers:
                server.close()
        _SERVERS.clear()
