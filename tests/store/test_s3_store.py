"""The run directory on a real S3 API (moto's server on loopback) through pyarrow's S3FileSystem:
parts and records without a journal (no append on S3), damage found and quarantined, and the
lock on conditional writes: a live lock refused, a stale one taken over by exactly one of
several racing sessions, a heartbeat that finds its lock taken over."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
from _s3 import moto_s3

from regen.core.errors import LockHeldError
from regen.store import RunDir, layout
from regen.store.completed import CompletedSample
from regen.store.doneset import read_done
from regen.store.layout import LockRecord
from regen.store.lock import LOCK_STALE_S, RunLock, S3LockStore, lock_store, read_lock
from regen.store.parts import list_parts
from regen.store.segments import Journal
from regen.store.verify import cheap_problems, verify_run


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as s:
        yield s


def to_table(rows):
    return pa.Table.from_pylist(rows)


def sample(i: int) -> CompletedSample:
    rows = [{"sample_id": f"src:{i}", "source": "src", "turn": 0, "prompt_tokens": 3,
             "completion_tokens": 5, "finish_reason": "stop"}]  # fmt: skip
    return CompletedSample(f"src:{i}", "src", rows)


def test_parts_records_and_no_journal_on_s3(s3) -> None:
    bucket = s3.bucket()
    rd = RunDir.open(s3.uri(bucket, "runs/a"))
    assert rd.is_object_store and isinstance(lock_store(rd), S3LockStore)
    j = Journal(rd, "S1", to_table)
    for i in range(3):
        j.append(sample(i))
    assert not any("/journal/" in k for k in s3.keys(bucket))  # nothing to append to
    assert j.roll() == "parts/S1-00000.parquet"
    keys = {k for k in s3.keys(bucket, "runs/a/parts/") if not k.endswith("/")}  # no markers
    assert keys == {"runs/a/parts/S1-00000.parquet", "runs/a/parts/_S1-00000.json"}
    done = read_done(rd)
    assert done.ids == {"src:0", "src:1", "src:2"} and done.damaged == []
    rep = verify_run(rd, check_plan=False)
    # these test rows are not regen.store.schema.SCHEMA, and no driver wrote a progress file: the
    # only
    # problems verify finds, and it says so
    assert [(p.kind, p.path) for p in rep.problems] == [
        ("schema", "parts/S1-00000.parquet"),
        ("progress", "progress.json"),
    ]
    assert rep.samples == 3 and rep.parts == 1


def test_damage_on_s3_is_found_and_quarantined(s3) -> None:
    bucket = s3.bucket()
    rd = RunDir.open(s3.uri(bucket, "runs/b"))
    j = Journal(rd, "S1", to_table)
    for i in range(4):
        j.append(sample(i))
        if i % 2:
            j.roll()
    first, second = (st.part for st in list_parts(rd))
    key = f"runs/b/{first}"
    body = s3.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    s3.client().put_object(Bucket=bucket, Key=key, Body=body[: len(body) // 2])  # cut short
    assert [p.split(":")[0] for p in cheap_problems(rd)] == [first]
    done = read_done(rd, repair=True)
    assert done.ids == {"src:2", "src:3"} and len(done.damaged) == 1 and first in done.damaged[0]
    assert f"runs/b/{layout.quarantine_path(first)}" in s3.keys(bucket)
    assert [st.part for st in list_parts(rd)] == [second]


def test_lock_on_conditional_writes(s3) -> None:
    rd = RunDir.open(s3.uri(s3.bucket(), "runs/c"))
    with RunLock(rd, "s1"):
        assert read_lock(rd).session == "s1"
        with pytest.raises(LockHeldError, match="locked by a live run"):
            RunLock(rd, "s2").acquire()
    assert not rd.exists(layout.LOCK)


def test_exactly_one_of_racing_sessions_takes_a_stale_lock_over(s3) -> None:
    rd = RunDir.open(s3.uri(s3.bucket(), "runs/d"))
    for _ in range(3):
        stale = LockRecord(host="elsewhere", pid=1, session="old", started_at=0.0,
                           heartbeat_at=time.time() - LOCK_STALE_S - 60)  # fmt: skip
        layout.LOCK_FILE.write(rd, stale)
        won: list[str] = []
        lost: list[str] = []
        go = threading.Barrier(6)

        def take(name: str, go=go, won=won, lost=lost) -> None:
            lock = RunLock(rd, name)
            go.wait()
            try:
                lock.acquire()
                won.append(name)
            except LockHeldError:
                lost.append(name)

        threads = [threading.Thread(target=take, args=(f"s{i}",)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(won) == 1 and len(lost) == 5
        assert read_lock(rd).session == won[0]
        rd.delete(layout.LOCK)


def test_a_heartbeat_finds_its_lock_taken_over(s3) -> None:
    rd = RunDir.open(s3.uri(s3.bucket(), "runs/e"))
    lost: list[str] = []
    lock = RunLock(rd, "s1", on_lost=lost.append)
    lock.acquire()
    thief = LockRecord(host="h2", pid=2, session="thief", started_at=0.0, heartbeat_at=time.time())
    layout.LOCK_FILE.write(rd, thief)
    lock.heartbeat()
    assert lost and "thief" in lost[0]
    lock.release()
    assert read_lock(rd).session == "thief"  # not removed: it is not ours


def test_a_file_rewritten_while_it_is_read_reads_whole(s3) -> None:
    """pyarrow reads an S3 object's size and its bytes in two requests; a progress.json that the
    driver replaces in between must not read as the first bytes of the new one (CI saw
    ``progress.json is damaged: EOF while parsing`` from a test reading a live run)."""
    rd = RunDir.open(s3.uri(s3.bucket(), "runs/torn"))
    versions = [{"i": i, "pad": "x" * (100 + 60 * (i % 7))} for i in range(10_000)]
    rd.write_json_atomic("progress.json", versions[0])
    stop = threading.Event()
    wrote = [0]

    def rewrite() -> None:  # sizes change with each version, as progress.json's do
        while not stop.is_set() and wrote[0] + 1 < len(versions):
            rd.write_json_atomic("progress.json", versions[wrote[0] + 1])
            wrote[0] += 1

    t = threading.Thread(target=rewrite, daemon=True)
    t.start()
    reads, deadline = [], time.monotonic() + 120
    try:
        while len(reads) < 300 and time.monotonic() < deadline:
            data = rd.read_bytes("progress.json")
            assert data is not None
            reads.append(data)
    finally:
        stop.set()
        t.join(30)
    assert wrote[0] >= 20, "the writer hardly ran: nothing was read during a rewrite"
    expected = {layout.dump_json(v) for v in versions[: wrote[0] + 1]}
    assert reads and [r for r in reads if r not in expected] == []
