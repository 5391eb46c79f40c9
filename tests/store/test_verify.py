"""regen.store.verify: every kind of damage named, --repair fixing what it can, the cheap check,
and a part written before records existed."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from regen.core.errors import LockHeldError, RunDirError
from regen.plan.index import rebuild
from regen.store import RunDir, layout
from regen.store.completed import CompletedSample
from regen.store.counts import SourceCounts
from regen.store.doneset import read_done
from regen.store.lock import RunLock
from regen.store.parts import list_parts
from regen.store.progress import ProgressSnapshot, SourceProgress
from regen.store.segments import Journal
from regen.store.verify import cheap_problems, refuse_damaged, verify_run


def sample(i: int, turns: int = 1) -> CompletedSample:
    rows = [{"sample_id": f"a:{i}", "source": "a", "turn": t, "prompt_tokens": 2,
             "completion_tokens": 10, "finish_reason": "stop"} for t in range(turns)]  # fmt: skip
    return CompletedSample(f"a:{i}", "a", rows)


def run_dir(tmp_path: Path, n: int = 8, per_part: int = 4) -> RunDir:
    rd = RunDir.open(tmp_path / "run")
    j = Journal(rd, "S1", pa.Table.from_pylist)
    for i in range(n):
        j.append(sample(i))
        if (i + 1) % per_part == 0:
            j.roll()
    snap = ProgressSnapshot(name="r", model="m", session="S1", host="h", pid=1, state="finished")
    snap.sources["a"] = SourceProgress(total=n, done=n, rows=n, prompt_tokens=2 * n,
                                       completion_tokens=10 * n,
                                       pending=SourceCounts())  # fmt: skip
    layout.PROGRESS_FILE.write(rd, snap)
    return rd


def kinds(rd: RunDir) -> list[tuple[str, str]]:
    rep = verify_run(rd, check_plan=False)
    return [(p.kind, p.path) for p in rep.problems if p.kind != "schema"]


def test_a_clean_directory(tmp_path: Path) -> None:
    rd = run_dir(tmp_path)
    rep = verify_run(rd, check_plan=False)
    assert [p.kind for p in rep.problems] == ["schema", "schema"]  # test rows, not SCHEMA
    assert (rep.parts, rep.samples, rep.rows) == (2, 8, 8)
    assert cheap_problems(rd) == []


def test_each_damage_is_named(tmp_path: Path) -> None:
    rd = run_dir(tmp_path, n=12)
    p0, p1, p2 = (st.part for st in list_parts(rd))
    root = tmp_path / "run"
    (root / p0).write_bytes((root / p0).read_bytes()[:50])
    (root / p1).unlink()
    data = bytearray((root / p2).read_bytes())
    data[40:48] = b"garbage!"
    (root / p2).write_bytes(bytes(data))
    seg = layout.segment_path("S0-00000")
    rd.write_bytes_atomic(seg, sample(20).to_line() + b"{not json}\n" + sample(21).to_line()[:9])
    got = kinds(rd)
    assert ("part_damaged", p0) in got and ("part_missing", p1) in got
    assert ("part_damaged", p2) in got
    assert ("journal_cut", seg) in got and ("journal_unreadable", seg) in got
    assert ("counts", layout.PROGRESS) in got  # 12 counted, 1 left (+1 journal line)
    assert sorted(p.split(":")[0] for p in cheap_problems(rd)) == sorted([p0, p1])
    with pytest.raises(RunDirError, match=r"regen verify .* --repair"):
        refuse_damaged(rd, "export")


def test_repair_quarantines_and_recounts(tmp_path: Path) -> None:
    rd = run_dir(tmp_path)
    p0 = list_parts(rd)[0].part
    (tmp_path / "run" / p0).write_bytes(b"PAR1 nothing")
    rep = verify_run(rd, repair=True, check_plan=False)
    assert rep.repaired
    assert layout.quarantine_path(p0).split("/")[-1] in rd.list(layout.QUARANTINE_DIR)
    assert read_done(rd).ids == {f"a:{i}" for i in range(4, 8)}
    assert layout.PROGRESS_FILE.read(rd).sources["a"].done == 4
    assert kinds(rd) == []


def test_repair_is_refused_beside_a_live_run(tmp_path: Path) -> None:
    rd = run_dir(tmp_path)
    (tmp_path / "run" / list_parts(rd)[0].part).unlink()
    with RunLock(rd, "live"), pytest.raises(LockHeldError):
        verify_run(rd, repair=True, check_plan=False)


def test_duplicates_are_named(tmp_path: Path) -> None:
    rd = run_dir(tmp_path, n=4)
    j = Journal(rd, "S2", pa.Table.from_pylist)
    j.append(sample(0))
    j.roll()
    got = kinds(rd)
    assert any(k == "duplicate" for k, _ in got)


def test_a_part_without_record_is_read_and_given_one(tmp_path: Path) -> None:
    rd = run_dir(tmp_path, n=4)
    st = list_parts(rd)[0]
    rd.delete(layout.part_record_path(st.stem))
    assert cheap_problems(rd) == []  # nothing to compare with: the footer reads
    rep = verify_run(rd, check_plan=False)
    assert any("no record" in n for n in rep.notes)
    done = read_done(rd, repair=True)
    assert len(done) == 4
    rec = layout.part_record_file(st.stem).read(rd)
    assert rec is not None and rec.samples == 4


def test_ids_not_in_the_plan_are_stale_not_lost(tmp_path: Path) -> None:
    """Stored samples the recorded plan does not hold are stale answers (noted, not counted,
    kept in their parts); --repair recounts, and the next verify is clean."""
    from regen.manifest import load_manifest
    from regen.plan.session import plan_session, write_plan
    from regen.sources import source_set
    from regen.store.run import prepare_run

    demo = Path(__file__).resolve().parents[2] / "manifests" / "demo.yaml"
    m = load_manifest(demo)
    rd = run_dir(tmp_path, n=4)
    prepare_run(rd, m, [])
    plan = plan_session(source_set(m), set(), {}, limit=10, rd=rd)
    write_plan(rd, plan, "S1", source_set(m).base_dir, 10)
    plan.spill.close()
    rep = verify_run(rd)
    assert any("4 stale answer(s) (4 of a sample no longer planned" in n for n in rep.notes)
    assert [p.message for p in rep.problems if p.kind == "counts"] == [
        "source 'a': 4 samples counted done, the parts and journal hold 0",
        "source 'a': 0 stale answers counted, the parts and journal hold 4",
    ]
    fixed = verify_run(rd, repair=True, rebuild_plan=rebuild)
    assert fixed.problems == [p for p in fixed.problems if p.kind == "schema"]
    snap = layout.PROGRESS_FILE.read(rd)
    assert (snap.sources["a"].done, snap.sources["a"].stale.done) == (0, 4)
    assert sum(sp.total for sp in snap.sources.values()) == 10
    assert read_done(rd).ids == {f"a:{i}" for i in range(4)}  # kept
    assert json.loads(json.dumps(rep.to_dict()))["clean"] is False


def _native_run(tmp_path: Path, n: int = 8) -> RunDir:
    """Parts of real rows (native rows: regen.store.schema.SCHEMA) and the progress file counting
    them: a directory verify finds clean (plan checks aside)."""
    from regen.core.sample import Sample
    from regen.engine.rows import native_row

    rd = RunDir.open(tmp_path / "run")
    j = Journal(rd, "S1")
    for i in range(n):
        s = Sample(f"k:{i}", "k", [], mode="native", input_ids=list(range(6)),
                   loss_mask=[0, 0, 1, 1, 1, 1])  # fmt: skip
        j.append(CompletedSample(s.id, "k", [native_row(s)]))
        if (i + 1) % 4 == 0:
            j.roll()
    snap = ProgressSnapshot(name="r", model="m", session="S1", host="h", pid=1, state="finished")
    snap.sources["k"] = SourceProgress(total=n, done=n, rows=n, prompt_tokens=2 * n,
                                       completion_tokens=4 * n, regenerate=False,
                                       pending=SourceCounts())  # fmt: skip
    layout.PROGRESS_FILE.write(rd, snap)
    assert verify_run(rd, check_plan=False).clean
    return rd


@pytest.mark.parametrize("garbage", [b"garbage{", b"", b'{"version": 1}', b"\x00\xff" * 40])
def test_repair_rebuilds_a_damaged_progress_file_from_the_parts(tmp_path, garbage) -> None:
    rd = _native_run(tmp_path)
    rd.write_bytes_atomic(layout.PROGRESS, garbage)
    rep = verify_run(rd, check_plan=False)
    assert [p.kind for p in rep.problems] == ["progress"]
    fixed = verify_run(rd, repair=True, check_plan=False)
    assert fixed.problems == [] and [p.kind for p in fixed.found] == ["progress"]
    snap = layout.PROGRESS_FILE.read(rd)
    assert snap is not None and snap.state == "finished"
    k = snap.sources["k"]
    assert (k.done, k.rows, k.prompt_tokens, k.completion_tokens) == (8, 8, 16, 32)
    assert layout.quarantine_path(layout.PROGRESS).split("/")[-1] in rd.list(layout.QUARANTINE_DIR)
    assert verify_run(rd, check_plan=False).clean


def test_repair_rebuilds_a_damaged_part_record_and_keeps_the_part(tmp_path: Path) -> None:
    rd = _native_run(tmp_path)
    st = list_parts(rd)[0]
    rd.write_bytes_atomic(layout.part_record_path(st.stem), b"\x00garbage")
    rep = verify_run(rd, check_plan=False)
    assert [(p.kind, p.path) for p in rep.problems] == [
        ("record_damaged", layout.part_record_path(st.stem))
    ]
    fixed = verify_run(rd, repair=True, check_plan=False)
    assert fixed.problems == [] and rd.exists(st.part)
    assert f"rebuilt {layout.part_record_path(st.stem)} from its part" in fixed.repaired
    assert read_done(rd).ids == {f"k:{i}" for i in range(8)}


def test_repair_sets_a_damaged_checks_file_aside(tmp_path: Path) -> None:
    rd = _native_run(tmp_path)
    rd.write_bytes_atomic(layout.CHECKS, b'{"key": 3')
    assert [p.kind for p in verify_run(rd, check_plan=False).problems] == ["checks"]
    fixed = verify_run(rd, repair=True, check_plan=False)
    assert fixed.problems == [] and not rd.exists(layout.CHECKS)
    assert layout.CHECKS_FILE.read(rd) is None  # the next run checks again and writes it


@pytest.mark.parametrize("damage", ["garbage", "deleted", "samples"])
def test_repair_rebuilds_the_plan_index_from_the_sources(tmp_path: Path, damage: str) -> None:
    from regen.manifest import load_manifest
    from regen.plan.session import plan_session, write_plan
    from regen.sources import source_set
    from regen.store.planned import recorded_plan
    from regen.store.run import prepare_run

    demo = Path(__file__).resolve().parents[2] / "manifests" / "demo.yaml"
    m = load_manifest(demo)
    rd = RunDir.open(tmp_path / "run")
    prepare_run(rd, m, [])
    plan = plan_session(source_set(m), set(), {}, limit=20, rd=rd)
    write_plan(rd, plan, "S1", source_set(m).base_dir, 20)
    plan.spill.close()
    want, _ = recorded_plan(rd)
    assert want is not None and verify_run(rd).clean
    if damage == "garbage":
        rd.write_bytes_atomic(layout.PLAN_INDEX, b'{"version": 1, "key"')
    elif damage == "deleted":
        rd.delete(layout.PLAN_INDEX)
    else:
        rd.write_bytes_atomic(layout.PLAN_SAMPLES, b"PAR1 not a plan")
    assert [p.kind for p in verify_run(rd).problems] == ["plan_index"]
    fixed = verify_run(rd, repair=True, rebuild_plan=rebuild)
    assert fixed.problems == [], fixed.repaired
    got, why = recorded_plan(rd)
    assert why == "" and got is not None and got.equals(want)
