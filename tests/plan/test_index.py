"""The plan index (plan/): a resume plans from it exactly what reading the sources plans, reads
only the unfinished rows, and rebuilds it (one line saying why) when anything that decides the
plan changed, when a source file changed, or when the index is damaged."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _runs import copy_demo

from regen.core.errors import SourceError
from regen.engine.schedule import WorkQueue
from regen.manifest import Manifest, load_manifest, parse_manifest
from regen.plan.index import iter_planned
from regen.plan.packed import unpacked
from regen.plan.session import SessionPlan, plan_session
from regen.sources import locate, source_set
from regen.store import RunDir, layout
from regen.store.failures import FailureRecord
from regen.store.planned import open_index, recorded_plan
from regen.store.run import write_manifest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    return copy_demo(tmp_path)


def fail(sid: str, permanent: bool) -> FailureRecord:
    return FailureRecord(sample_id=sid, source=sid.split(":")[0], kind="x", status=400,
                         message="m", attempts=1, permanent=permanent, at=1.0)  # fmt: skip


def contents(plan: SessionPlan) -> dict:
    """Everything a session takes from its plan, bodies included."""
    with plan.spill:
        bodies = {p.id: unpacked(p.loaded(plan.spill)) for p in plan.todo}
    return {
        "todo": bodies,
        "turns": {p.id: (p.source, p.turns, p.chars, p.original) for p in plan.todo},
        "native": {s.id: s for s in plan.native},
        "totals": plan.totals,
        "skipped": plan.skipped_failed,
    }


def fresh(m: Manifest, done: set[str] = frozenset(), failures=None, **kw) -> dict:  # type: ignore[assignment]
    """What reading the sources plans (no run directory: no index)."""
    return contents(plan_session(source_set(m), set(done), failures or {}, **kw))


def indexed(rd: RunDir, m: Manifest, done=frozenset(), failures=None, **kw) -> tuple[bool, dict]:  # type: ignore[no-untyped-def]
    plan = plan_session(source_set(m), set(done), failures or {}, rd=rd, **kw)
    return plan.indexed, contents(plan)


def test_a_resume_plans_from_the_index_what_reading_the_sources_plans(demo, tmp_path) -> None:
    m = load_manifest(demo)
    rd = RunDir.open(tmp_path / "run")
    used, first = indexed(rd, m)
    assert not used and layout.PLAN_INDEX_FILE.read(rd) is not None
    ids = sorted(first["todo"]) + sorted(first["native"])
    done = set(ids[::3])
    failures = {ids[1]: fail(ids[1], True), ids[2]: fail(ids[2], False)}
    for retry in (False, True):
        used, got = indexed(rd, m, done, failures, retry_failed=retry)
        assert used
        assert got == fresh(m, done, failures, retry_failed=retry)
    assert got["skipped"] == 0 and fresh(m, done, failures)["skipped"] == 1
    assert got["native"]  # the demo's native rows come back whole from the index


def test_a_limit_is_a_prefix_of_the_indexed_stream(demo, tmp_path, caplog) -> None:
    m = load_manifest(demo)
    rd = RunDir.open(tmp_path / "run")
    indexed(rd, m)  # the whole stream
    for limit in (1, 15, 40):
        used, got = indexed(rd, m, limit=limit)
        assert used and got == fresh(m, limit=limit)
    small = RunDir.open(tmp_path / "small")
    indexed(small, m, limit=10)
    assert indexed(small, m, limit=7)[0]
    caplog.set_level(logging.WARNING)
    used, got = indexed(small, m, limit=20)  # more than it holds: read again, written again
    assert not used and got == fresh(m, limit=20)
    assert "holds the first 10 samples and this session plans --limit 20" in caplog.text
    assert layout.PLAN_INDEX_FILE.read(small).limit == 20  # type: ignore[union-attr]
    assert indexed(small, m, limit=20)[0]


def _append_row(path: Path) -> str:
    row = {"id": "sg_new", "conversations": [{"from": "human", "value": "a brand new question"},
                                             {"from": "gpt", "value": "an answer"}]}  # fmt: skip
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return "size"


def _same_size_other_head(path: Path) -> str:
    data = bytearray(path.read_bytes())
    i = data.index(b"value") + 9  # inside the first user message
    data[i] = ord("Z") if data[i] != ord("Z") else ord("Y")
    path.write_bytes(bytes(data))
    return "first or last bytes differ"


def _touched(path: Path) -> str:
    st = path.stat()
    import os

    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    return "mtime"


@pytest.mark.parametrize("change", [_append_row, _same_size_other_head, _touched])
def test_a_changed_source_file_rebuilds_the_index_with_one_line(demo, tmp_path, caplog, change):
    m = load_manifest(demo)
    rd = RunDir.open(tmp_path / "run")
    indexed(rd, m)
    why = change(demo.parent / "demo" / "sharegpt.jsonl")
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="regen.plan.session")
    used, got = indexed(rd, m)
    assert not used and got == fresh(m)
    lines = [r.getMessage() for r in caplog.records if r.name == "regen.plan.session"]
    assert len(lines) == 1 and "sources.0.path" in lines[0] and why in lines[0], lines
    assert indexed(rd, m)[0]  # written again, valid again


@pytest.mark.parametrize(
    "overrides",
    [
        ["dedup.near=false"],
        ["dedup.threshold=0.9"],
        ["sources.0.filters.max_turns=1"],
        ["sources.1.limit=3"],
        ["sources.0.turns=last"],
    ],
)
def test_settings_that_decide_the_plan_rebuild_it(demo, tmp_path, caplog, overrides) -> None:
    rd = RunDir.open(tmp_path / "run")
    indexed(rd, load_manifest(demo))
    m = load_manifest(demo, overrides)
    caplog.set_level(logging.WARNING, logger="regen.plan.session")
    used, got = indexed(rd, m)
    assert not used and got == fresh(m)
    assert "changed since it was written" in caplog.text


def _truncate_record(rd: RunDir) -> None:
    data = rd.read_bytes(layout.PLAN_INDEX) or b""
    Path(rd.path(layout.PLAN_INDEX)).write_bytes(data[: len(data) // 2])


def _garbage_samples(rd: RunDir) -> None:
    p = Path(rd.path(layout.PLAN_SAMPLES))
    p.write_bytes(b"\x00" * p.stat().st_size)


def _other_valid_samples(rd: RunDir) -> None:
    p = Path(rd.path(layout.PLAN_SAMPLES))
    t = pq.read_table(p)
    pq.write_table(t.slice(1), p)  # a readable file that is not the indexed one


def _no_samples(rd: RunDir) -> None:
    Path(rd.path(layout.PLAN_SAMPLES)).unlink()


def _no_record(rd: RunDir) -> None:
    Path(rd.path(layout.PLAN_INDEX)).unlink()


@pytest.mark.parametrize(
    "damage", [_truncate_record, _garbage_samples, _other_valid_samples, _no_samples, _no_record]
)
def test_a_damaged_index_is_rebuilt_never_trusted(demo, tmp_path, damage) -> None:
    m = load_manifest(demo)
    rd = RunDir.open(tmp_path / "run")
    indexed(rd, m)
    damage(rd)
    used, got = indexed(rd, m, {"sharegpt:sg_0001#9d675194"})
    assert not used and got == fresh(m, {"sharegpt:sg_0001#9d675194"})
    assert indexed(rd, m)[0]


def test_a_resume_reads_only_the_unfinished_rows_when_dispatched(demo, tmp_path, monkeypatch):
    m = load_manifest(demo)
    rd = RunDir.open(tmp_path / "run")
    first = plan_session(source_set(m), set(), {}, rd=rd)
    first.spill.close()
    reads: list[tuple[str, int]] = []
    real = locate.LineReader.read

    def spy(self, offset: int, length: int) -> bytes:  # type: ignore[no-untyped-def]
        reads.append((self.path.name, offset))
        return real(self, offset, length)

    monkeypatch.setattr(locate.LineReader, "read", spy)
    todo_ids = [p.id for p in first.todo]
    done = set(todo_ids[::2])
    plan = plan_session(source_set(m), done, {}, rd=rd)
    assert plan.indexed
    native = len(plan.native)
    assert len(reads) == native  # only the native rows to store are read before dispatch
    reads.clear()
    q = WorkQueue(plan.todo, spill=plan.spill)
    with plan.spill:
        got = [unpacked(q.pop()) for _ in range(len(q))]  # type: ignore[arg-type]
    assert sorted(s.id for s in got) == sorted(set(todo_ids) - done)
    assert len(reads) == len(got)  # one read per unfinished sample, none for done ones
    entries = open_index(rd, source_set(m), None)[0].table.to_pylist()  # type: ignore[union-attr]
    where = {(Path(m.resolve(m.source(e["source"]).path or "")).name, e["offset"]): e["id"]
             for e in entries}  # fmt: skip
    assert sorted(where[r] for r in reads) == sorted(s.id for s in got)


def test_a_row_changed_during_the_run_stops_with_one_error(demo, tmp_path) -> None:
    m = load_manifest(demo)
    rd = RunDir.open(tmp_path / "run")
    plan_session(source_set(m), set(), {}, rd=rd).spill.close()
    plan = plan_session(source_set(m), set(), {}, rd=rd)
    path = demo.parent / "demo" / "sharegpt.jsonl"
    data = path.read_bytes()
    path.write_bytes(data.replace(b"e", b"E"))  # same size, other content (after planning)
    q = WorkQueue(plan.todo, spill=plan.spill)
    with plan.spill, pytest.raises(SourceError, match=r"sources\.0\.path: row \d+ is not what"):
        while q.pop() is not None:
            pass
    assert layout.PLAN_INDEX_FILE.read(rd) is None  # the next session rebuilds it


def test_parquet_sources_are_indexed_by_row_group_and_read_by_row_group(tmp_path) -> None:
    def conv(i: int) -> list[dict[str, str]]:
        return [{"from": "human", "value": f"question {i} " * (i + 1)},
                {"from": "gpt", "value": "x" * i}]  # fmt: skip

    rows = [{"id": f"r{i}", "conversations": conv(i)} for i in range(23)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "s.parquet", row_group_size=5)
    m = parse_manifest({"name": "t", "target": {"model": "m", "tokenizer": "tok"},
                        "sources": [{"name": "s", "adapter": "sharegpt", "path": "s.parquet"}]},
                       base_dir=tmp_path)  # fmt: skip
    rd = RunDir.open(tmp_path / "run")
    indexed(rd, m)
    t = open_index(rd, source_set(m), None)[0].table  # type: ignore[union-attr]
    assert t.column("group").to_pylist() == [i // 5 for i in range(23)]
    assert t.column("offset").to_pylist() == [i % 5 for i in range(23)]
    ids = sorted(t.column("id").to_pylist())
    for done in (set(), set(ids[:11]), set(ids[::2])):
        used, got = indexed(rd, m, done)
        assert used and got == fresh(m, done)


def test_hub_samples_are_kept_in_the_index(tmp_path, monkeypatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # a local dataset folder: no network
    ds = tmp_path / "ds"
    ds.mkdir()
    with (ds / "train.jsonl").open("w") as f:
        for i in range(9):
            conv = [{"from": "human", "value": f"hub question {i} " * (i + 1)},
                    {"from": "gpt", "value": "y" * (3 * i)}]  # fmt: skip
            f.write(json.dumps({"id": f"h{i}", "conversations": conv}) + "\n")
    m = parse_manifest({"name": "t", "target": {"model": "m", "tokenizer": "tok"},
                        "sources": [{"name": "h", "adapter": "sharegpt",
                                     "hub": {"id": str(ds), "split": "train"}}]},
                       base_dir=tmp_path)  # fmt: skip
    want = fresh(m)
    rd = RunDir.open(tmp_path / "run")
    indexed(rd, m)
    assert rd.exists(layout.PLAN_ROWS)
    shutil.rmtree(ds)  # a resume does not read the hub
    done = sorted(want["todo"])[0]
    used, got = indexed(rd, m, {done})
    assert used
    del want["todo"][done], want["turns"][done]
    assert got == want


def test_the_recorded_plan_is_read_from_the_index_alone(demo, tmp_path, monkeypatch) -> None:
    """What the latest session planned (ids and content hashes), read from plan/ without the
    sources, even once they changed (that is a new plan only when a session plans again)."""
    from regen.plan.session import write_plan

    m = load_manifest(demo)
    rd = RunDir.open(tmp_path / "run")
    plan = plan_session(source_set(m), set(), {}, rd=rd, limit=30)
    write_plan(rd, plan, "S", source_set(m).base_dir, 30)
    write_manifest(rd, m)
    plan.spill.close()
    want = {p.id for p in plan.todo} | {s.id for s in plan.native}
    hashes = {s.id: s.content_hash for s in iter_planned(source_set(m), 30)}

    def no_reading(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("the sources were read")

    for where in ("regen.sources.read_samples", "regen.plan.index.read_samples"):
        monkeypatch.setattr(where, no_reading)  # wherever the planned stream reads them from
    first = m.resolve(m.sources[0].path)
    first.write_bytes(first.read_bytes().replace(b"Paris", b"Rome"))
    table, why = recorded_plan(rd)
    assert why == "" and table is not None
    assert set(table.column("id").to_pylist()) == want
    assert dict(zip(table.column("id").to_pylist(), table.column("content_hash").to_pylist(),
                    strict=True)) == {k: hashes[k] for k in want}  # fmt: skip
    rd.write_bytes_atomic(layout.PLAN_SAMPLES, b"PAR1 garbage")
    table, why = recorded_plan(rd)
    assert table is None and "not the file" in why
