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
    """What the driver does with a stored sample (regen.engine.recorder.SessionRecorder.keep)."""
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
         "errors": {"server_error": {"count": 1, "message": "boom", "at": 5.0}},
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


def worker_snap(sent: int, ok: int, state: str = "up") -> dict:
    boom = {"server_error": {"count": 1, "message": "boom", "at": 5.0}}
    return {"in_flight": 0, "sent": sent, "ok": ok, "retried": 0, "failed": 0,
            "errors": boom if sent != ok else {},
            "endpoints": {"http://e/v1": {"state": state, "in_flight": 0, "ok": ok,
                                          "failures": sent - ok, "throttled": 0}},
            "latencies": {"http://e/v1": [0.2]}}  # fmt: skip


def session(rd: RunDir, name: str) -> ProgressTracker:
    return ProgressTracker(rd, name="n", model="m", session=name, run_started_at=1.0,
                           endpoints=["http://e/v1"])  # fmt: skip


def test_a_resumed_session_goes_on_from_the_runs_counters(tmp_path) -> None:
    """Issue 31, item 4: requests, errors, endpoints and the length histogram cover the whole
    run; a session that sent nothing does not replace them by zeros."""
    rd = RunDir.open(tmp_path / "r")
    first = session(rd, "S1")
    first.start_from(DoneSet(), {"a": (2, True)}, {})
    stored(first, "a", [row("a:0", 100, source="local")], was_failed=False)
    first.workers([worker_snap(sent=3, ok=2)])
    first.write("finished")

    idle = session(rd, "S2")  # nothing left to do: no worker ever reports
    idle.carry_over(layout.PROGRESS_FILE.read(rd))
    idle.write("finished")
    snap = layout.PROGRESS_FILE.read(rd)
    assert (snap.requests.sent, snap.requests.ok) == (3, 2)
    assert snap.errors["server_error"].count == 1
    (ep,) = snap.endpoints
    assert (ep.healthy, ep.ok, ep.errors, ep.in_flight) == (True, 2, 1, 0)
    assert snap.output_tokens_hist.total == 1

    more = session(rd, "S3")  # a session that works adds to them
    more.carry_over(layout.PROGRESS_FILE.read(rd))
    stored(more, "a", [row("a:1", 50, source="local")], was_failed=False)
    more.workers([worker_snap(sent=1, ok=1, state="down")])
    more.write("finished")
    snap = layout.PROGRESS_FILE.read(rd)
    assert (snap.requests.sent, snap.requests.ok) == (4, 3)
    (ep,) = snap.endpoints
    assert (ep.healthy, ep.ok, ep.errors) == (False, 3, 1)  # health: this session's
    assert snap.output_tokens_hist.total == 2

    moved = ProgressTracker(rd, name="n", model="m", session="S4", run_started_at=1.0,
                            endpoints=["http://f/v1"])  # fmt: skip
    moved.carry_over(layout.PROGRESS_FILE.read(rd))  # the server moved (the demo's new port)
    moved.write("finished")
    snap = layout.PROGRESS_FILE.read(rd)
    assert snap.endpoints == [] and snap.requests.sent == 4  # the old one is gone, not "up"
