"""run.json / fingerprint checks and the lock (live, stale by heartbeat, stale by dead pid)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from regen.errors import FingerprintMismatchError, LockHeldError
from regen.manifest import parse_manifest
from regen.store import RunDir
from regen.store.run import LOCK_FILE, RunLock, lock_is_live, prepare_run, public_url


def _manifest(temperature: float = 0.6):
    return parse_manifest(
        {
            "name": "t",
            "target": {"model": "m", "tokenizer": "tok"},
            "sampling": {"temperature": temperature},
            "sources": [{"name": "s", "adapter": "sharegpt", "path": "x.jsonl"}],
        }
    )


def test_prepare_run_writes_once_and_refuses_other_fingerprint(tmp_path) -> None:
    rd = RunDir.open(tmp_path / "r")
    info = prepare_run(rd, _manifest(), ["http://u:secret@h:1/v1"])
    assert info["fingerprint"] == _manifest().fingerprint()
    assert rd.read_json("run.json")["endpoints"] == ["http://h:1/v1"]
    assert "secret" not in rd.read_text("run.json")
    assert "name: t" in rd.read_text("manifest.yaml")
    again = prepare_run(rd, _manifest(), [])
    assert again["created_at"] == info["created_at"]
    with pytest.raises(FingerprintMismatchError):
        prepare_run(rd, _manifest(temperature=0.0), [])
    forced = prepare_run(rd, _manifest(temperature=0.0), [], force=True)
    assert forced["fingerprint"] == _manifest(0.0).fingerprint()
    assert forced["previous_fingerprints"] == [info["fingerprint"]]
    assert rd.read_json("run.json")["fingerprint"] == forced["fingerprint"]


def test_public_url_strips_credentials() -> None:
    assert public_url("https://a:b@host:8/v1") == "https://host:8/v1"
    assert public_url("http://host/v1") == "http://host/v1"


def test_second_lock_refused_while_live_then_released(tmp_path) -> None:
    rd = RunDir.open(tmp_path / "r")
    with RunLock(rd, "s1") as lock:
        held = rd.read_json(LOCK_FILE)
        assert held["session"] == "s1"
        assert {"owner", "host", "pid", "started_at", "heartbeat_at"} <= held.keys()
        with pytest.raises(LockHeldError):
            RunLock(rd, "s2").acquire()
        lock.heartbeat()
    assert not rd.exists(LOCK_FILE)
    with RunLock(rd, "s2"):
        assert rd.read_json(LOCK_FILE)["session"] == "s2"


def test_stale_heartbeat_is_taken_over(tmp_path, caplog) -> None:
    rd = RunDir.open(tmp_path / "r")
    now = time.time()
    rd.write_json_atomic(
        LOCK_FILE,
        {"owner": "x", "host": "elsewhere", "pid": 1, "session": "old",
         "started_at": now - 100, "heartbeat_at": now - 31},
    )  # fmt: skip
    with RunLock(rd, "new"):
        assert rd.read_json(LOCK_FILE)["session"] == "new"
    assert "stale lock" in caplog.text


def test_dead_pid_on_this_host_is_stale(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead_pid = int(proc.stdout)
    now = time.time()
    lock = {"host": socket.gethostname(), "pid": dead_pid, "heartbeat_at": now}
    assert not lock_is_live(lock, now)
    assert lock_is_live({**lock, "host": "other-host"}, now)
    assert lock_is_live({**lock, "pid": __import__("os").getpid()}, now)
    assert not lock_is_live({**lock, "host": "other-host"}, now + 31)
