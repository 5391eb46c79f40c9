"""A full disk is a pause (regen.engine.diskfull, regen.store.segments): the journal keeps every
answer in memory, nothing is half-written, the writes are retried with a backoff, and a crash
during the pause loses only what was held in memory (requested again), never a row twice.

The run-level tests (a real run on a disk that fills, with space back in time or not, and a
SIGKILL during the pause) are in tests/reliability/test_bad_input.py.
"""

from __future__ import annotations

import errno
import importlib.util
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from regen.core.errors import RunDirError
from regen.engine.diskfull import RETRY_S, DiskWait
from regen.store import RunDir
from regen.store.completed import CompletedSample
from regen.store.doneset import read_done
from regen.store.parts import disk_full
from regen.store.segments import Journal, read_journal_lines, recover


def _quota_disk():
    """tests/reliability/_quota_fs.QuotaDisk: a local disk that fills up."""
    spec = importlib.util.spec_from_file_location(
        "_quota_fs", Path(__file__).parents[1] / "reliability" / "_quota_fs.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.QuotaDisk


def to_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows)


def sample(i: int) -> CompletedSample:
    sid = f"src:{i}"
    rows = [{"sample_id": sid, "source": "src", "turn": 0, "text": f"answer {i} " * 8,
             "prompt_tokens": 10, "completion_tokens": 5, "finish_reason": "stop"}]  # fmt: skip
    return CompletedSample(sid, "src", rows)


def stored_ids(rd: RunDir) -> Counter[str]:
    """Every sample id of every part's rows (a row stored twice counts twice)."""
    out: Counter[str] = Counter()
    for name in rd.list("parts"):
        if name.endswith(".parquet"):
            t = pq.read_table(rd.path(f"parts/{name}"), filesystem=rd.fs)
            out.update(t.column("sample_id").to_pylist())
    return out


def enospc(msg: str = "cannot write progress.json") -> RunDirError:
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError as e:
        try:
            raise RunDirError(f"{msg}: {e}") from e
        except RunDirError as wrapped:
            return wrapped


# -- which errors are a full disk ----------------------------------------------------------------


def test_a_full_disk_or_quota_is_told_by_errno_through_the_wrapping() -> None:
    assert disk_full(enospc())
    assert disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not disk_full(RunDirError("cannot write part: permission denied"))
    assert not disk_full(OSError(errno.EACCES, "Permission denied"))


# -- the pause's clock ---------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_pause_retries_with_a_backoff_and_ends_when_a_write_succeeds() -> None:
    clock = Clock()
    w = DiskWait(60.0, hold_max=8, clock=clock)
    assert not w.paused and not w.due() and not w.holding(100)
    assert w.refused(enospc()) is True  # the first: say so
    assert w.paused and not w.due()
    gaps = []
    for _ in range(5):
        gaps.append(w.left_s())
        clock.t += w.left_s()
        assert w.due()
        assert w.refused(enospc()) is False  # said once
    assert gaps == [RETRY_S[0], RETRY_S[1], RETRY_S[2], RETRY_S[2], RETRY_S[2]]
    assert w.holding(8) and not w.holding(7)
    clock.t += 1.0
    assert w.cleared() == pytest.approx(clock.t - 100.0)
    assert not w.paused and not w.holding(100) and w.pauses == 1
    assert w.refused(enospc()) is True  # a second pause is said again


def test_past_the_wait_the_last_error_stops_the_session() -> None:
    clock = Clock()
    w = DiskWait(5.0, hold_max=8, clock=clock)
    w.refused(enospc())
    for _ in range(100):  # bounded: 2 s apart at most, 5 s in all
        clock.t += w.left_s()
        try:
            w.refused(enospc("cannot append to journal/S-00000.jsonl"))
        except RunDirError as e:
            assert "journal/S-00000.jsonl" in str(e) and "No space left" in str(e)
            break
    else:
        pytest.fail("the wait never ended")
    assert clock.t - 100.0 >= 5.0


def test_no_wait_and_other_errors_stop_at_once() -> None:
    with pytest.raises(RunDirError, match="No space left"):
        DiskWait(0.0, hold_max=8, clock=Clock()).refused(enospc())
    with pytest.raises(RunDirError, match="permission"):
        DiskWait(60.0, hold_max=8, clock=Clock()).refused(RunDirError("permission denied"))


# -- the journal through a full disk ---------------------------------------------------------------


@pytest.fixture
def disk(tmp_path):
    return _quota_disk()(tmp_path / "disk", 10**9)


def test_a_full_disk_mid_line_seals_the_segment_and_loses_no_sample(disk, tmp_path) -> None:
    rd = disk.rundir(tmp_path / "disk" / "run")
    j = Journal(rd, "S1", to_table)
    for i in range(3):
        j.append(sample(i))
    disk.capacity = disk.used + 40  # the next line is cut part-way
    with pytest.raises(RunDirError, match="No space left") as e:
        j.append(sample(3))
    assert disk_full(e.value) and j.sealed and j.pending == 4 and j.unjournaled == 1
    for i in range(4, 8):  # held in memory: nothing written, nothing raised
        j.append(sample(i))
    with pytest.raises(RunDirError, match="No space left"):
        j.roll()  # the part does not fit: nothing of it is left
    assert rd.list("parts", include_temp=True) == [] and j.pending == 8
    assert [s.sample_id for s in read_journal_lines(rd)] == ["src:0", "src:1", "src:2"]

    disk.capacity = 10**9  # space is back: one part holds them all, the segment goes
    assert j.roll() == "parts/S1-00000.parquet"
    assert not j.sealed and j.pending == 0 and j.unjournaled == 0
    assert rd.list("journal") == []
    j.append(sample(8))  # a new segment, journaled again
    assert [s.sample_id for s in read_journal_lines(rd)] == ["src:8"]
    j.close()
    assert stored_ids(rd) == Counter(f"src:{i}" for i in range(9))
    assert read_done(rd).ids == {f"src:{i}" for i in range(9)}


def test_a_crash_during_the_pause_keeps_the_journaled_lines_only(disk, tmp_path) -> None:
    """A SIGKILL while the disk is full: what the segment holds whole is recovered, the cut
    line and the samples held in memory are requested again; no row is stored twice."""
    rd = disk.rundir(tmp_path / "disk" / "run")
    first = Journal(rd, "S1", to_table)
    for i in range(4):
        first.append(sample(i))
    first.roll()  # one good part: src:0-3
    for i in range(4, 7):
        first.append(sample(i))
    disk.capacity = disk.used + 40
    with pytest.raises(RunDirError):
        first.append(sample(7))
    first.append(sample(8))
    with pytest.raises(RunDirError):
        first.roll()
    del first  # the process dies here: its memory is gone

    disk.capacity = 10**9  # the next session, with space
    assert recover(rd, to_table) == 3
    done = read_done(rd).ids
    assert done == {f"src:{i}" for i in range(7)}  # src:7 (cut) and src:8 (memory): again
    again = Journal(rd, "S2", to_table)
    for i in (7, 8):
        again.append(sample(i))
    again.close()
    assert stored_ids(rd) == Counter(f"src:{i}" for i in range(9))


def test_a_part_whose_record_the_disk_refused_is_written_and_its_record_follows(
    disk, tmp_path
) -> None:
    rd = disk.rundir(tmp_path / "disk" / "run")
    j = Journal(rd, "S1", to_table)
    for i in range(3):
        j.append(sample(i))
    real = disk.open_output_stream

    def no_record(path, metadata=None):
        if Path(path).name.endswith("_S1-00000.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, metadata)

    disk.open_output_stream = no_record
    assert j.roll() == "parts/S1-00000.parquet"  # the part counts: it verifies by itself
    assert j.owed == 1 and "_S1-00000.json" not in rd.list("parts")
    disk.open_output_stream = real
    j.append(sample(3))
    j.close()
    assert j.owed == 0 and {"_S1-00000.json", "_S1-00001.json"} <= set(rd.list("parts"))
    assert stored_ids(rd) == Counter(f"src:{i}" for i in range(4))
