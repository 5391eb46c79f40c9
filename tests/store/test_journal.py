"""Journal → parts: folding, crash recovery, no duplicates, disk full, failures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from regen.core.errors import RunDirError
from regen.store import RunDir
from regen.store.completed import CompletedSample
from regen.store.doneset import read_done
from regen.store.failures import FailureLog, FailureRecord, read_failures
from regen.store.segments import Journal, read_journal_lines, recover


def fail(sid, kind, status, message, attempts, permanent, at) -> FailureRecord:
    return FailureRecord(sample_id=sid, source="src", kind=kind, status=status, message=message,
                         attempts=attempts, permanent=permanent, at=at)  # fmt: skip


def to_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows)


def sample(i: int, turns: int = 1, finish: str = "stop") -> CompletedSample:
    sid = f"src:{i}"
    rows = [
        {"sample_id": sid, "source": "src", "turn": t, "text": f"answer {i}/{t} é",
         "prompt_tokens": 10, "completion_tokens": 5, "finish_reason": finish}
        for t in range(turns)
    ]  # fmt: skip
    return CompletedSample(sid, "src", rows)


@pytest.fixture(params=["path", "uri"])
def rd(request, tmp_path) -> RunDir:
    return RunDir.open(tmp_path / "run" if request.param == "path" else f"file://{tmp_path}/run")


def all_rows(rd: RunDir) -> list[dict]:
    out = []
    for name in rd.list("parts"):
        if name.endswith(".parquet"):
            out += pq.read_table(rd.path(f"parts/{name}"), filesystem=rd.fs).to_pylist()
    return out


def test_append_roll_and_done_set(rd: RunDir) -> None:
    j = Journal(rd, "S1", to_table)
    for i in range(3):
        j.append(sample(i, turns=2))
    assert j.due(part_size=3, part_interval_s=1e9)
    assert not j.due(part_size=4, part_interval_s=1e9)
    assert len(read_journal_lines(rd)) == 3  # flushed as they complete
    assert j.roll() == "parts/S1-00000.parquet"
    j.append(sample(3, finish="length"))
    j.close()
    assert rd.list("parts") == ["S1-00000.parquet", "S1-00001.parquet", "_S1-00000.json",
                                "_S1-00001.json"]  # fmt: skip
    assert rd.list("journal") == []
    done = read_done(rd)
    assert done.ids == {"src:0", "src:1", "src:2", "src:3"}
    t = done.sources["src"]
    assert (t.done, t.rows, t.truncated, t.completion_tokens) == (4, 7, 1, 35)
    assert sorted((r["sample_id"], r["turn"]) for r in all_rows(rd)) == sorted(
        [(f"src:{i}", t) for i in range(3) for t in range(2)] + [("src:3", 0)]
    )


def test_recover_drops_cut_line_and_keeps_complete_ones(rd: RunDir) -> None:
    j = Journal(rd, "S1", to_table)
    j.append(sample(0))
    j.append(sample(1))
    # simulate a crash in the middle of writing the third line
    seg = f"journal/{j.stem}.jsonl"
    data = rd.read_bytes(seg) + sample(2).to_line()[:25]
    rd.write_bytes_atomic(seg, data)
    assert [s.sample_id for s in read_journal_lines(rd)] == ["src:0", "src:1"]
    assert recover(rd, to_table) == 2
    assert rd.list("journal") == []
    assert read_done(rd).ids == {"src:0", "src:1"}


def test_crash_between_rename_and_journal_delete_never_duplicates(rd: RunDir) -> None:
    j = Journal(rd, "S1", to_table)
    j.append(sample(0))
    j.append(sample(1))
    seg = f"journal/{j.stem}.jsonl"
    kept = rd.read_bytes(seg)
    j.roll()
    rd.write_bytes_atomic(seg, kept)  # as if the process died before deleting the segment
    recover(rd, to_table)
    assert rd.list("journal") == []
    rows = all_rows(rd)
    assert sorted(r["sample_id"] for r in rows) == ["src:0", "src:1"]


def test_recover_skips_current_session_and_removes_temp_parts(rd: RunDir) -> None:
    old = Journal(rd, "S0", to_table)
    old.append(sample(0))
    cur = Journal(rd, "S1", to_table)
    cur.append(sample(1))
    rd.write_bytes_atomic("parts/.tmp-S0-99999.parquet", b"half")
    recover(rd, to_table, skip="S1")
    assert rd.list("parts", include_temp=True) == ["S0-00000.parquet", "_S0-00000.json"]
    assert rd.list("journal") == ["S1-00000.jsonl"]


def _quota_disk():
    """tests/reliability/_quota_fs.QuotaDisk: a local disk that fills up."""
    spec = importlib.util.spec_from_file_location(
        "_quota_fs", Path(__file__).parents[1] / "reliability" / "_quota_fs.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.QuotaDisk


def test_disk_full_leaves_no_half_written_part(tmp_path) -> None:
    disk = _quota_disk()(tmp_path / "disk", 10**9)
    rd = disk.rundir(tmp_path / "disk" / "run")
    j = Journal(rd, "S1", to_table)
    j.append(sample(0))
    disk.capacity = disk.used + 100  # the part does not fit
    with pytest.raises(RunDirError, match="No space left"):
        j.roll()
    assert disk.full_errors >= 1
    assert rd.list("parts", include_temp=True) == []
    # the journal still holds the sample: the next run recovers it
    assert [s.sample_id for s in read_journal_lines(rd)] == ["src:0"]
    disk.capacity = 10**9
    recover(rd, to_table)
    assert read_done(rd).ids == {"src:0"}


def test_failures_latest_record_wins(rd: RunDir) -> None:
    log = FailureLog(rd, "S1")
    log.append(fail("src:1", "server_error", 503, "busy", 8, False, 1.0))
    log.append(fail("src:2", "context_length", 400, "too long", 1, True, 1.0))
    log.close()
    log2 = FailureLog(rd, "S2")
    log2.append(fail("src:1", "permanent", 400, "bad", 1, True, 2.0))
    log2.close()
    fails = read_failures(rd)
    assert {k: (v.kind, v.permanent) for k, v in fails.items()} == {
        "src:1": ("permanent", True),
        "src:2": ("context_length", True),
    }
