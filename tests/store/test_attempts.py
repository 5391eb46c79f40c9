"""Two attempts of one sample in the run directory (issue 15): the latest answer wins in the
done-set, the counters count differences, the records, recovery and verify agree, and the
selection of `regen run --retry-flagged` reads only what the parts hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from regen.engine.tracker import ProgressTracker
from regen.plan.attempts import RetryFlagged, attempt_seed, select
from regen.store import RunDir, layout
from regen.store.completed import CompletedSample
from regen.store.counts import SourceCounts, count_rows, output_tokens
from regen.store.doneset import read_done
from regen.store.parts import list_parts
from regen.store.progress import ProgressSnapshot, SourceProgress
from regen.store.segments import Journal, recover
from regen.store.verify import verify_run


def rows(sid: str, attempt: int, flags: list[list[str]], tokens: int = 10) -> list[dict[str, Any]]:
    """One row per turn; ``flags[t]`` are turn t's quality flags."""
    return [{"sample_id": sid, "source": "a", "turn": t, "prompt_tokens": 2,
             "completion_tokens": tokens, "finish_reason": "stop", "attempt": attempt,
             "quality_flags": f} for t, f in enumerate(flags)]  # fmt: skip


def first_session(rd: RunDir) -> None:
    j = Journal(rd, "S1", pa.Table.from_pylist)
    j.append(CompletedSample("a:0", "a", rows("a:0", 0, [["repetition"], []], tokens=50)))
    j.append(CompletedSample("a:1", "a", rows("a:1", 0, [[]])))
    j.append(CompletedSample("a:2", "a", rows("a:2", 0, [["refusal"]])))
    j.roll()


def retry_session(rd: RunDir, *, fold: bool = True) -> None:
    """a:0 answered again (one clean turn), with what it replaces (as the driver passes it)."""
    before = read_done(rd, answers=True)
    j = Journal(rd, "S2", pa.Table.from_pylist)
    new = rows("a:0", 1, [[]], tokens=20)
    j.append(CompletedSample("a:0", "a", new, before.flagged["a:0"].to_counts()))
    if fold:
        j.roll()


def record_totals(rd: RunDir) -> SourceCounts:
    """What status adds up: the part records, never the parts."""
    total = SourceCounts()
    for st in list_parts(rd):
        assert st.record is not None
        total.add(st.record.sources["a"])
    return total


@pytest.fixture
def rd(tmp_path: Path) -> RunDir:
    rd = RunDir.open(tmp_path / "run")
    first_session(rd)
    return rd


def test_the_latest_answer_wins_and_counters_are_differences(rd: RunDir) -> None:
    done = read_done(rd, answers=True)
    a = done.sources["a"]
    assert (a.done, a.rows, a.flagged, a.flags, a.retried) == (
        3, 4, 2, {"repetition": 1, "refusal": 1}, 0)  # fmt: skip
    assert select(done, RetryFlagged(("repetition",))) == {"a:0": 1}
    assert select(done, RetryFlagged(("repetition", "refusal"))) == {"a:0": 1, "a:2": 1}

    retry_session(rd)
    done = read_done(rd, answers=True)
    a = done.sources["a"]
    assert len(done) == 3 and done.attempts == {"a:0": 1}
    assert (a.done, a.rows, a.flagged, a.flags, a.retried) == (3, 3, 1, {"refusal": 1}, 1)
    assert a.completion_tokens == 20 + 10 + 10  # a:0's new answer, not its old 2 x 50
    assert record_totals(rd) == a  # the records say the same without opening a part
    assert select(done, RetryFlagged(("repetition",))) == {}


def test_a_retry_flagged_again_is_retried_only_while_attempts_remain(rd: RunDir) -> None:
    before = read_done(rd, answers=True)
    j = Journal(rd, "S2", pa.Table.from_pylist)
    j.append(CompletedSample("a:0", "a", rows("a:0", 1, [["repetition"]]),
                             before.flagged["a:0"].to_counts()))  # fmt: skip
    j.roll()
    done = read_done(rd, answers=True)
    assert done.sources["a"].flags == {"repetition": 1, "refusal": 1}
    assert select(done, RetryFlagged(("repetition",), max_retries=1)) == {}
    assert select(done, RetryFlagged(("repetition",), max_retries=2)) == {"a:0": 2}


def test_a_retry_left_in_the_journal_by_a_crash_is_folded_with_its_difference(
    rd: RunDir,
) -> None:
    retry_session(rd, fold=False)  # killed before the part was written
    assert recover(rd, pa.Table.from_pylist) == 1
    done = read_done(rd, answers=True)
    assert done.sources["a"].retried == 1 and done.sources["a"].flagged == 1
    assert record_totals(rd) == done.sources["a"]


def test_a_retry_part_without_a_record_gets_the_difference(rd: RunDir) -> None:
    retry_session(rd)
    want = record_totals(rd)
    stem = list_parts(rd)[-1].stem
    rd.delete(layout.part_record_path(stem))
    read_done(rd, repair=True, answers=True)
    assert layout.part_record_file(stem).read(rd).sources["a"].retried == 1
    assert record_totals(rd) == want


def test_verify_knows_attempts_and_still_names_a_real_duplicate(rd: RunDir) -> None:
    retry_session(rd)
    done = read_done(rd, answers=True)
    snap = ProgressSnapshot(name="r", model="m", session="S2", host="h", pid=1, state="finished")
    sp = SourceProgress(total=3, pending=SourceCounts())
    sp.add(done.sources["a"])
    snap.sources["a"] = sp
    layout.PROGRESS_FILE.write(rd, snap)
    rep = verify_run(rd, check_plan=False)
    assert [p.kind for p in rep.problems if p.kind != "schema"] == []
    assert (rep.samples, rep.rows) == (3, 3)

    j = Journal(rd, "S3", pa.Table.from_pylist)  # the same attempt stored again
    j.append(CompletedSample("a:1", "a", rows("a:1", 0, [[]])))
    j.roll()
    dups = [p for p in verify_run(rd, check_plan=False).problems if p.kind == "duplicate"]
    assert len(dups) == 1 and "('a:1', 0, 0)" in dups[0].message


def test_flagged_counts_that_disagree_are_named(rd: RunDir) -> None:
    done = read_done(rd, answers=True)
    snap = ProgressSnapshot(name="r", model="m", session="S1", host="h", pid=1, state="finished")
    sp = SourceProgress(total=3, pending=SourceCounts())
    sp.add(done.sources["a"])
    sp.flagged += 1
    snap.sources["a"] = sp
    layout.PROGRESS_FILE.write(rd, snap)
    got = [p.message for p in verify_run(rd, check_plan=False).problems if p.kind == "counts"]
    assert got == ["source 'a': 3 flagged samples counted, the parts and journal hold 2"]
    verify_run(rd, repair=True, check_plan=False)
    assert layout.PROGRESS_FILE.read(rd).sources["a"].flagged == 2


def test_a_part_from_before_the_columns_is_attempt_zero_without_flags(tmp_path: Path) -> None:
    rd = RunDir.open(tmp_path / "run")
    j = Journal(rd, "S0", pa.Table.from_pylist)
    old = [{k: v for k, v in r.items() if k not in ("attempt", "quality_flags")}
           for r in rows("a:9", 0, [[]])]  # fmt: skip
    j.append(CompletedSample("a:9", "a", old))
    j.roll()
    done = read_done(rd, answers=True)
    assert len(done) == 1 and done.attempts == {} and done.flagged == {}
    assert done.sources["a"].flagged == 0


def test_the_tracker_counts_a_new_attempt_as_a_difference(tmp_path: Path) -> None:
    rd = RunDir.open(tmp_path / "run")
    first_session(rd)
    done = read_done(rd, answers=True)
    t = ProgressTracker(rd, name="r", model="m", session="S2", run_started_at=0.0, endpoints=[])
    t.start_from(done, {"a": (3, True)}, {}, {"a": 2})
    sp = t.snap.sources["a"]
    assert (sp.remaining, sp.retrying) == (2, 2)
    old = done.flagged["a:0"].to_counts()
    new = CompletedSample("a:0", "a", rows("a:0", 1, [[]], tokens=20), replaces=old)
    t.sample_counted("a", new.counts(), output_tokens(new.rows), was_failed=False, retry=True)
    assert (sp.done, sp.rows, sp.flagged, sp.flags, sp.retried, sp.retrying) == (
        3, 3, 1, {"refusal": 1}, 1, 1)  # fmt: skip
    assert sp.pending is not None and sp.pending.retried == 1 and sp.pending.done == 0
    assert t.session_tokens == 20  # what the server generated this session
    assert count_rows(rows("a:0", 1, [["repetition", "refusal"]])).flags == {
        "repetition": 1,
        "refusal": 1,
    }


def test_attempt_seeds() -> None:
    assert attempt_seed(None, 0) is None and attempt_seed(7, 0) == 7
    assert attempt_seed(None, 1) == 1 and attempt_seed(7, 2) == 9
