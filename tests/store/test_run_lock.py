"""run.json / fingerprint checks and the lock: live, stale by heartbeat, stale by dead pid,
a race between two takers, a lock taken over while its holder looked dead."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from regen.core.errors import FingerprintMismatchError, LockHeldError
from regen.manifest import parse_manifest
from regen.store import RunDir, layout
from regen.store.layout import LockRecord
from regen.store.lock import CLOCK_SKEW_S, LOCK_STALE_S, RunLock, read_lock, why_gone
from regen.store.run import prepare_run, public_url

REPO = Path(__file__).resolve().parents[2]


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
    assert info.fingerprint == _manifest().fingerprint()
    assert layout.RUN_FILE.read(rd).endpoints == ["http://h:1/v1"]
    assert "secret" not in rd.read_text(layout.RUN)
    assert "name: t" in rd.read_text(layout.MANIFEST)
    again = prepare_run(rd, _manifest(), [])
    assert again.created_at == info.created_at
    with pytest.raises(FingerprintMismatchError) as refused:
        prepare_run(rd, _manifest(temperature=0.0), [])
    # each field that changed, with both values (not two hashes)
    assert "sampling.temperature 0.6 -> 0.0 (run directory -> this manifest)" in str(refused.value)
    assert info.fingerprint not in str(refused.value)
    forced = prepare_run(rd, _manifest(temperature=0.0), [], force=True)
    assert forced.fingerprint == _manifest(0.0).fingerprint()
    assert forced.previous_fingerprints == [info.fingerprint]
    assert layout.RUN_FILE.read(rd).fingerprint == forced.fingerprint
    # what each settings id of the run's rows stands for
    settings = layout.RUN_FILE.read(rd).settings
    assert {k: v["sampling.temperature"] for k, v in settings.items()} == {
        _manifest().settings_id(): 0.6,
        _manifest(0.0).settings_id(): 0.0,
    }


def test_the_refusal_names_every_changed_field(tmp_path) -> None:
    from regen.manifest import parse_manifest

    def manifest(**kw):
        data = {"name": "t", "target": {"model": "m", "tokenizer": "tok"},
                "sampling": {"temperature": 0.6},
                "sources": [{"name": "s", "adapter": "sharegpt", "path": "x.jsonl"}]}  # fmt: skip
        for k, v in kw.items():
            data[k] = v
        return parse_manifest(data)

    rd = RunDir.open(tmp_path / "r")
    prepare_run(rd, manifest(), [])
    other = manifest(
        target={"model": "k2", "tokenizer": "tok"},
        sampling={"temperature": 0.6, "max_tokens": 512},
        sources=[{"name": "s", "adapter": "sharegpt", "path": "x.jsonl", "limit": 5},
                 {"name": "new", "adapter": "xlam", "path": "y.jsonl"}],
    )  # fmt: skip
    with pytest.raises(FingerprintMismatchError) as refused:
        prepare_run(rd, other, [])
    msg = str(refused.value)
    for part in ('target.model "m" -> "k2"', "sampling.max_tokens 4096 -> 512",
                 "sources.s.limit null -> 5", "sources.new: added"):  # fmt: skip
        assert part in msg, msg
    assert "sources.new.adapter" not in msg  # a new source is one entry
    rd.write_text_atomic(layout.MANIFEST, "not: [a manifest")  # nothing left to compare with
    with pytest.raises(FingerprintMismatchError, match=r"fingerprint [0-9a-f]{32}, this manifest"):
        prepare_run(rd, other, [])


def test_public_url_strips_credentials() -> None:
    assert public_url("https://a:b@host:8/v1") == "https://host:8/v1"
    assert public_url("http://host/v1") == "http://host/v1"


def test_second_lock_refused_while_live_then_released(tmp_path) -> None:
    rd = RunDir.open(tmp_path / "r")
    with RunLock(rd, "s1") as lock:
        held = read_lock(rd)
        assert held is not None and held.session == "s1" and held.pid == os.getpid()
        with pytest.raises(LockHeldError, match="locked by a live run"):
            RunLock(rd, "s2").acquire()
        lock.heartbeat()
        assert read_lock(rd).heartbeat_at >= held.heartbeat_at
    assert not rd.exists(layout.LOCK)
    with RunLock(rd, "s2"):
        assert read_lock(rd).session == "s2"


def _write_lock(rd: RunDir, **kw) -> None:
    now = time.time()
    rec = {"owner": "x", "host": "elsewhere", "pid": 1, "session": "old",
           "started_at": now - 100, "heartbeat_at": now, **kw}  # fmt: skip
    layout.LOCK_FILE.write(rd, LockRecord(**rec))


def test_stale_heartbeat_is_taken_over(tmp_path, caplog) -> None:
    rd = RunDir.open(tmp_path / "r")
    # another host: the staleness limit plus the clock-skew allowance
    _write_lock(rd, heartbeat_at=time.time() - LOCK_STALE_S - 5)
    with pytest.raises(LockHeldError):
        RunLock(rd, "new").acquire()
    _write_lock(rd, heartbeat_at=time.time() - LOCK_STALE_S - CLOCK_SKEW_S - 1)
    with RunLock(rd, "new"):
        assert read_lock(rd).session == "new"
    assert "stale lock" in caplog.text


def test_dead_pid_on_this_host_is_taken_over_at_once(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    rd = RunDir.open(tmp_path / "r")
    _write_lock(rd, host=socket.gethostname(), pid=int(proc.stdout))
    with RunLock(rd, "new"):
        assert read_lock(rd).session == "new"


def test_a_lock_taken_over_is_noticed_by_its_heartbeat(tmp_path) -> None:
    rd = RunDir.open(tmp_path / "r")
    lost: list[str] = []
    lock = RunLock(rd, "s1", on_lost=lost.append)
    lock.acquire()
    _write_lock(rd, session="thief", heartbeat_at=time.time())
    lock.heartbeat()
    assert lost and "taken over by session thief" in lost[0]
    lock.release()
    assert read_lock(rd).session == "thief"  # the thief's lock is not removed


def test_a_stale_lock_has_one_taker_and_is_never_absent(tmp_path) -> None:
    """While one session takes a stale lock over (it holds the marker), the lock file stays
    in place, so another session neither takes it nor creates a second one beside it."""
    rd = RunDir.open(tmp_path / "r")
    _write_lock(rd, heartbeat_at=time.time() - 3600)
    marker = Path(rd.path(layout.LOCK_TAKEOVER))
    marker.write_bytes(b"")  # a taker at work
    with pytest.raises(LockHeldError, match="at the same time"):
        RunLock(rd, "second").acquire()
    assert read_lock(rd).session == "old" and marker.exists()
    marker.unlink()  # the taker is done (here: it gave up)
    lock = RunLock(rd, "second")
    lock.acquire()
    assert read_lock(rd).session == "second" and not marker.exists()
    lock.release()


def test_a_marker_left_by_a_dead_taker_is_cleared(tmp_path) -> None:
    rd = RunDir.open(tmp_path / "r")
    _write_lock(rd, heartbeat_at=time.time() - 3600)
    marker = Path(rd.path(layout.LOCK_TAKEOVER))
    marker.write_bytes(b"")
    old = time.time() - LOCK_STALE_S - 5
    os.utime(marker, (old, old))
    lock = RunLock(rd, "new")
    lock.acquire()  # the first try clears the marker, the next takes the lock over
    assert read_lock(rd).session == "new" and not marker.exists()
    lock.release()


RACE = """
import sys, time
from regen.core.errors import LockHeldError
from regen.store import RunDir
from regen.store.lock import RunLock
rd = RunDir.open(sys.argv[1])
while time.time() < float(sys.argv[2]):
    pass
try:
    RunLock(rd, sys.argv[3]).acquire()
    print("won", flush=True)
    time.sleep(3)  # hold it (a holder whose pid is gone is stale at once)
except LockHeldError:
    print("lost", flush=True)
"""


def test_two_processes_racing_for_a_stale_lock_one_wins(tmp_path) -> None:
    rd = RunDir.open(tmp_path / "r")
    for _ in range(2):
        _write_lock(rd, heartbeat_at=time.time() - 3600)
        start = time.time() + 1.5
        procs = [subprocess.Popen([sys.executable, "-c", RACE, str(tmp_path / "r"), str(start),
                                   f"s{i}"], stdout=subprocess.PIPE, text=True, cwd=REPO)
                 for i in range(4)]  # fmt: skip
        results = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
        assert results == ["lost", "lost", "lost", "won"]


def test_the_one_lock_staleness_rule() -> None:
    now = 1_000_000.0
    rec = LockRecord(host="a", pid=1, session="s", started_at=now - 100, heartbeat_at=now - 20)
    alive = {"pid_alive": lambda pid: True}
    assert why_gone(rec, now, hostname="a", **alive) == ""
    assert "pid 1 is gone" in why_gone(rec, now, hostname="a", pid_alive=lambda pid: False)
    old = rec.model_copy(update={"heartbeat_at": now - LOCK_STALE_S - 1})
    assert "heartbeat" in why_gone(old, now, hostname="a", **alive)
    # from another host the clock-skew allowance applies, and the pid is not ours to check
    assert why_gone(old, now, hostname="b", pid_alive=lambda pid: False) == ""
    older = rec.model_copy(update={"heartbeat_at": now - LOCK_STALE_S - CLOCK_SKEW_S - 1})
    assert "heartbeat" in why_gone(older, now, hostname="b", **alive)
