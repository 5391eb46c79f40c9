"""What a session sets out to do: --limit, done samples, recorded failures, order."""

from __future__ import annotations

from pathlib import Path

from regen.manifest import load_manifest
from regen.plan.index import native_check as _native_check
from regen.plan.session import plan_session
from regen.sources import read_samples, source_set
from regen.store.failures import FailureRecord

DEMO = Path(__file__).resolve().parents[2] / "manifests" / "demo.yaml"


def fail(sid: str, permanent: bool) -> FailureRecord:
    return FailureRecord(sample_id=sid, source=sid.split(":")[0], kind="x", status=400,
                         message="m", attempts=1, permanent=permanent, at=1.0)  # fmt: skip


def test_limit_done_failures_and_order() -> None:
    m = source_set(load_manifest(DEMO))
    ids = [s.id for s in read_samples(m, None, _native_check(m))]
    first = ids[:20]
    done = set(first[:5])
    failures = {first[5]: fail(first[5], True), first[6]: fail(first[6], False)}
    plan = plan_session(m, done, failures, limit=20)
    planned = [s.id for s in plan.todo] + [s.id for s in plan.native]
    assert sorted(planned) == sorted(set(first) - done - {first[5]})  # transient ones retried
    assert plan.skipped_failed == 1
    assert sum(t for t, _ in plan.totals.values()) == 20
    with plan.spill:  # the bodies wait in the spill file; each comes back whole
        bodies = [p.loaded(plan.spill).unpack() for p in plan.todo]
    assert [b.id for b in bodies] == [p.id for p in plan.todo]
    assert [b.turns_to_regenerate() for b in bodies] == [p.turns for p in plan.todo]
    assert all(p.blob == b"" and p.at >= 0 for p in plan.todo)  # nothing held in memory
    again = plan_session(m, done, failures, limit=20, retry_failed=True)
    assert first[5] in {s.id for s in again.todo}
    again.spill.close()


def test_plan_record_counts_what_is_left(tmp_path) -> None:
    from regen.plan.session import write_plan
    from regen.store import RunDir, layout

    m = source_set(load_manifest(DEMO))
    plan = plan_session(m, set(), {}, limit=30)
    rd = RunDir.open(tmp_path / "run")
    rec = write_plan(rd, plan, "S", m.base_dir, 30)
    plan.spill.close()
    assert layout.PLAN_FILE.read(rd) == rec
    assert rec.limit == 30 and rec.manifest_dir == str(DEMO.parent)
    assert sum(e.total for e in rec.sources.values()) == 30
    for name, e in rec.sources.items():
        todo = [p for p in plan.todo if p.source == name]
        assert e.regenerate_todo == len(todo)
        assert e.regenerate_turns == sum(p.turns_to_regenerate() for p in todo)


def test_done_samples_to_redo_are_planned_as_their_new_attempt() -> None:
    m = source_set(load_manifest(DEMO))
    samples = list(read_samples(m, None, _native_check(m)))[:20]
    regen = [s.id for s in samples if s.mode == "regenerate"]
    native = next((s.id for s in samples if s.mode == "native"), None)
    done = {s.id for s in samples}
    redo = {regen[0]: 1, regen[3]: 2}
    if native is not None:
        redo[native] = 1  # never flagged in practice; a native row is never requested
    plan = plan_session(m, done, {}, limit=20, redo=redo)
    with plan.spill:
        bodies = {p.id: p.loaded(plan.spill).unpack() for p in plan.todo}
    assert {k: b.attempt for k, b in bodies.items()} == {regen[0]: 1, regen[3]: 2}
    assert plan.native == []
    src = {s.id: s.source for s in samples}
    want: dict[str, int] = {}
    for sid in (regen[0], regen[3]):
        want[src[sid]] = want.get(src[sid], 0) + 1
    assert plan.retries == want
    assert sum(t for t, _ in plan.totals.values()) == 20  # the totals do not change
