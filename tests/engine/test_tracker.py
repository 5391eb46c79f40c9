"""progress.json as the driver writes it: the shape regen.store.progress reads, cumulative
counters."""

from __future__ import annotations

from regen.engine.tracker import ProgressTracker
from regen.engine.worker import SampleOutcome
from regen.store import RunDir, layout
from regen.store.completed import CompletedSample
from regen.store.counts import output_tokens
from regen.store.doneset import DoneSet


def row(sid: str, ct: int, finish: str = "stop", source: str = "native_or_not") -> dict:
    return {"sample_id": sid, "prompt_tokens": 10, "completion_tokens": ct,
            "finish_reason": finish, "token_source": source}  # fmt: skip


def stored(t: ProgressTracker, source: str, rows: list[dict], *, was_failed: bool) -> None:
    """What the driver does with a stored sample (regen.engine.driver._Session.keep)."""
    done = CompletedSample(rows[0]["sample_id"], source, rows)
    t.sample_counted(source, done.counts(), output_tokens(rows), was_failed=was_failed,
                     retry=False)  # fmt: skip


def test_counters_and_shape(tmp_path) -> None:
    rd = RunDir.open(tmp_path / "r")
    t = ProgressTracker(rd, name="n", model="m", session="S", run_started_at=1.0,
                        endpoints=["http://e/v1"])  # fmt: skip
    done = DoneSet()
    done.add("a", "a:0", [row("a:0", 7, source="local")])
    t.start_from(done, {"a": (3, True), "nat": (1, False)}, {"a": 1})
    stored(t, "a", [row("a:1", 100, "length", "local"), row("a:1", 5, source="local")],
           was_failed=True)  # fmt: skip
    stored(t, "nat", [row("nat:0", 50, source="native")], was_failed=False)
    t.sample_failed(SampleOutcome("a:2", "a", status="permanent"), newly_permanent=True)
    t.workers([
        {"in_flight": 2, "sent": 5, "ok": 3, "retried": 1, "failed": 1,
         "errors": {"server_error": [1, "boom", 5.0]},
         "endpoints": {"http://e/v1": {"state": "up", "in_flight": 2, "ok": 3, "failures": 1,
                                       "throttled": 0}},
         "latencies": {"http://e/v1": [0.1, 0.3, 0.2]}},
        {"in_flight": 1, "sent": 2, "ok": 2, "retried": 0, "failed": 0, "errors": {},
         "endpoints": {"http://e/v1": {"state": "down", "in_flight": 1, "ok": 2, "failures": 0,
                                       "throttled": 2}},
         "latencies": {}},
    ])  # fmt: skip
    t.driver_error("worker_died", "gone")
    t.write("finished")
    snap = layout.PROGRESS_FILE.read(rd)
    a, nat = snap.sources["a"], snap.sources["nat"]
    assert (a.total, a.done, a.failed, a.truncated, a.rows) == (3, 2, 1, 1, 3)
    assert a.completion_tokens == 112 and nat.completion_tokens == 50 and not nat.regenerate
    assert snap.output_tokens_hist.total == 2  # regenerated turns of this session only
    assert (snap.requests.sent, snap.requests.ok, snap.requests.retried) == (7, 5, 1)
    assert snap.in_flight == 3 and snap.state == "finished"
    (ep,) = snap.endpoints
    assert (ep.in_flight, ep.ok, ep.errors, ep.healthy, ep.latency_p50_s) == (3, 5, 3, False, 0.2)
    assert set(snap.errors) == {"server_error", "worker_died"}
    assert snap.token_series[-1][1] == 105  # generated this session: native rows are not
