"""What a session sets out to do: --limit, done samples, recorded failures, order."""

from __future__ import annotations

from pathlib import Path

from regen.engine import RunOptions
from regen.engine.driver import _native_check, plan_session
from regen.manifest import load_manifest
from regen.sources import read_samples
from regen.store.journal import FailureRecord

DEMO = Path(__file__).resolve().parents[2] / "manifests" / "demo.yaml"


def fail(sid: str, permanent: bool) -> FailureRecord:
    return FailureRecord(sid, sid.split(":")[0], "x", 400, "m", 1, permanent, 1.0)


def test_limit_done_failures_and_order() -> None:
    m = load_manifest(DEMO)
    ids = [s.id for s in read_samples(m, None, _native_check(m))]
    first = ids[:20]
    done = set(first[:5])
    failures = {first[5]: fail(first[5], True), first[6]: fail(first[6], False)}
    plan = plan_session(m, done, failures, RunOptions(limit=20))
    planned = [s.id for s in plan.todo] + [s.id for s in plan.native]
    assert sorted(planned) == sorted(set(first) - done - {first[5]})  # transient ones retried
    assert plan.skipped_failed == 1
    assert sum(t for t, _ in plan.totals.values()) == 20
    with plan.spill:  # the bodies wait in the spill file; each comes back whole
        bodies = [p.loaded(plan.spill).unpack() for p in plan.todo]
    assert [b.id for b in bodies] == [p.id for p in plan.todo]
    assert [b.turns_to_regenerate() for b in bodies] == [p.turns for p in plan.todo]
    assert all(p.blob == b"" and p.at >= 0 for p in plan.todo)  # nothing held in memory
    again = plan_session(m, done, failures, RunOptions(limit=20, retry_failed=True))
    assert first[5] in {s.id for s in again.todo}
    again.spill.close()
