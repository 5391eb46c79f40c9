"""The fork server (regen.devkit.forkserver) on this venv's Python and a test entry
point (_forked_entry.py): what a forked process is given, its exit code, its group, and the
refusals (a fork server holding threads; another load-time environment, another fork server)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from regen.devkit import forkserver
from regen.devkit.forkserver import ForkServer, Program, fork_server
from regen.devkit.procs import group_alive, stop_group

HERE = Path(__file__).resolve().parent
PY = Path(sys.executable)
#: the test entry point, as a fork server runs it
ENTRY = Program(PY, "_forked_entry", "main")


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k != "FORKED_ENTRY_THREAD"}
    return {**base, "PYTHONPATH": str(HERE), **extra}


@pytest.fixture
def server() -> Iterator[ForkServer]:
    srv = ForkServer(ENTRY, env())
    yield srv
    srv.close()


def test_a_forked_process_gets_its_argv_environment_directory_and_log(
    server: ForkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    seen, log = tmp_path / "seen.json", tmp_path / "out.log"
    proc = server.spawn(["-c", str(seen), "3"], env(FORKED_VAR="one"), log)
    assert proc.wait(timeout=30) == 3 and proc.returncode == 3
    got = json.loads(seen.read_text())
    assert got["argv"] == ["-c", str(seen), "3"] and got["var"] == "one"
    assert got["cwd"] == str(tmp_path)
    # a session and group of its own, like a start_new_session child
    assert got["pid"] == proc.pid == got["pgid"] == got["sid"]
    assert log.read_text() == "to the log\n"
    # the next one takes its own environment, not the last one's
    proc = server.spawn(["-c", str(seen), "0"], env(), log)
    assert proc.wait(timeout=30) == 0 and json.loads(seen.read_text())["var"] is None


def test_the_setup_runs_once_in_the_fork_server_and_every_fork_inherits_it(tmp_path: Path) -> None:
    setup = "import os, _forked_entry\n_forked_entry.SET_UP = os.getpid()\n"
    srv = ForkServer(Program(PY, "_forked_entry", "main", setup=setup), env())
    try:
        seen = tmp_path / "seen.json"
        for code in (0, 4):
            proc = srv.spawn(["-c", str(seen), str(code)], env(), tmp_path / "out.log")
            assert proc.wait(timeout=30) == code
            got = json.loads(seen.read_text())
            assert got["set_up"] == srv._proc.pid != got["pid"]
    finally:
        srv.close()
    # none given, none run
    plain = ForkServer(ENTRY, env())
    try:
        assert (
            plain.spawn(["-c", str(seen), "0"], env(), tmp_path / "out.log").wait(timeout=30) == 0
        )
        assert json.loads(seen.read_text())["set_up"] is None
    finally:
        plain.close()


def test_stop_group_stops_a_forked_process(server: ForkServer, tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"
    proc = server.spawn(["-c", str(seen), "sleep"], env(), tmp_path / "out.log")
    deadline = time.monotonic() + 30
    while not seen.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None
    stop_group(proc, timeout_s=10)
    assert proc.returncode == -signal.SIGTERM
    assert not group_alive(proc.pid)


def test_a_fork_server_holding_threads_refuses_to_fork(tmp_path: Path) -> None:
    srv = ForkServer(ENTRY, env(FORKED_ENTRY_THREAD="1"))
    try:
        with pytest.raises(OSError, match="2 threads after the import"):
            srv.spawn(["-c", str(tmp_path / "seen.json"), "0"], env(), tmp_path / "out.log")
        assert not (tmp_path / "seen.json").exists()
    finally:
        srv.close()


def test_a_process_that_cannot_start_exits_1_and_the_next_one_is_forked(
    server: ForkServer, tmp_path: Path
) -> None:
    seen = tmp_path / "seen.json"
    # its log's directory does not exist: the forked process fails before the entry point
    proc = server.spawn(["-c", str(seen), "0"], env(), tmp_path / "no" / "out.log")
    assert proc.wait(timeout=30) == 1 and not seen.exists()
    proc = server.spawn(["-c", str(seen), "4"], env(), tmp_path / "out.log")
    assert proc.wait(timeout=30) == 4 and seen.exists()


def test_a_fork_server_that_died_is_an_error_and_the_next_one_is_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(forkserver, "_SERVERS", {})
    try:
        first = fork_server(ENTRY, env())
        seen = tmp_path / "seen.json"
        sleeper = first.spawn(["-c", str(seen), "sleep"], env(), tmp_path / "out.log")
        os.kill(first._proc.pid, signal.SIGKILL)
        first._proc.wait(timeout=30)
        with pytest.raises(OSError, match="exited with code -9"):
            first._ask({"exit_of": sleeper.pid})  # what a request finds: no answer, an error
        assert "the fork server exited with code -9" in caplog.text
        with pytest.raises(OSError, match="exited with code -9"):  # and again, the same
            first.spawn(["-c", str(seen), "0"], env(), tmp_path / "out.log")
        # what it forked goes on; its exit code went with the fork server
        assert sleeper.poll() is None
        stop_group(sleeper, timeout_s=10)
        assert sleeper.returncode == -9 and not group_alive(sleeper.pid)
        second = forkserver.fork_or_none(ENTRY, ["-c", str(seen), "5"],
                                         env(), tmp_path / "out.log")  # fmt: skip
        assert second is not None and second.wait(timeout=30) == 5
        assert second._server is not first and second._server.alive()
    finally:
        forkserver.close_all()  # the dead one included: closing it raises nothing


def test_one_fork_server_per_load_time_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forkserver, "_SERVERS", {})
    try:
        first = fork_server(ENTRY, env(FORKED_VAR="a"))
        # a variable read after the import: the same fork server
        assert fork_server(ENTRY, env(FORKED_VAR="b")) is first
        # one read at load time: another
        other = fork_server(ENTRY, env(PYTHONHASHSEED="7"))
        assert other is not first and other.env["PYTHONHASHSEED"] == "7"
        assert first.env["OMP_NUM_THREADS"] == "1"  # the fork server's own OpenMP
    finally:
        forkserver.close_all()
    assert not first.alive() and not other.alive()


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2 :].split()[1])


@pytest.mark.parametrize("fork", [True, False])
def test_a_simulator_is_forked_unless_told_not_to(fork: bool) -> None:
    from regen.devkit.simulate.testing import running_simulator

    with running_simulator(fork=fork) as sim:
        assert sim.process is not None and sim.get("/v1/models")["data"]
        pid = sim.process.pid
        assert os.getpgid(pid) == pid  # a group of its own either way
        parent = _parent(pid)
        assert (parent != os.getpid()) is fork
        if fork:  # its parent is the fork server, this process's child
            assert _parent(parent) == os.getpid()
    assert sim.process.poll() is not None and not group_alive(pid)
