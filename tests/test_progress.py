"""ProgressSnapshot: the exact progress.json shape, round trips, helpers, and clear rejections
(read and written through regen.store.layout.PROGRESS_FILE like every other record)."""

from __future__ import annotations

import itertools
import json

import pytest

from regen.core.errors import RunDirError
from regen.store import RunDir, layout
from regen.store.counts import SourceCounts
from regen.store.progress import (
    SERIES_MAX_POINTS,
    SERIES_WINDOW_S,
    EndpointProgress,
    OutputHistogram,
    ProgressSnapshot,
    SourceProgress,
)

CONTRACT_EXAMPLE = {
    "version": 1,
    "name": "kimi-regen",
    "model": "moonshotai/Kimi-K2.5",
    "session": "s-20261129-0835",
    "host": "node-1",
    "pid": 4242,
    "state": "running",
    "run_started_at": 1000.0,
    "started_at": 2000.0,
    "updated_at": 2100.5,
    "endpoints_configured": ["http://10.0.0.5:30000/v1", "http://10.0.0.6:30000/v1"],
    "sources": {
        "sharegpt": {
            "total": 100,
            "done": 40,
            "failed": 2,
            "truncated": 3,
            "rows": 90,
            "prompt_tokens": 12000,
            "completion_tokens": 55000,
            "regenerate": True,
            "flagged": 5,
            "flags": {"repetition": 3, "empty_content": 2, "refusal": 1},
            "retried": 2,
            "retrying": 1,
            "pending": {
                "done": 4,
                "rows": 9,
                "truncated": 0,
                "prompt_tokens": 1200,
                "completion_tokens": 5000,
                "flagged": 1,
                "flags": {"repetition": 1},
                "retried": 0,
            },
        },
        "kimi": {
            "total": 10,
            "done": 10,
            "failed": 0,
            "truncated": 0,
            "rows": 10,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "regenerate": False,  # no "pending": written before it existed (not reconciled)
            "flagged": 0,
            "flags": {},
            "retried": 0,
            "retrying": 0,
        },
    },
    "in_flight": 17,
    "requests": {"sent": 120, "ok": 100, "retried": 6, "failed": 2},
    "token_series": [[2000.0, 0], [2005.0, 900], [2010.0, 2100]],
    "errors": {"timeout": {"count": 4, "last_message": "read timed out", "last_at": 2090.0}},
    "endpoints": [
        {
            "url": "http://10.0.0.5:30000/v1",
            "in_flight": 9,
            "healthy": True,
            "health": "up",
            "stalls": 0,
            "latency_p50_s": 12.5,
            "ok": 60,
            "errors": 1,
            "server_running": 16.0,  # the server's /metrics: every client's requests
            "server_queued": 2.0,
            "server_kv_usage": 0.42,
        },
        {
            "url": "http://10.0.0.6:30000/v1",
            "in_flight": 8,
            "healthy": False,
            "health": "stalled",
            "stalls": 3,
            "latency_p50_s": None,
            "ok": 40,
            "errors": 5,
            "server_running": None,  # no page read
            "server_queued": None,
            "server_kv_usage": None,
        },
    ],
    "output_tokens_hist": {"edges": [0, 256, 1024], "counts": [10, 70, 20]},
}


def parse(d: object) -> ProgressSnapshot:
    """The record of a progress.json holding ``d``."""
    return layout.PROGRESS_FILE.parse(json.dumps(d).encode())


def written(snap: ProgressSnapshot) -> object:
    """What progress.json holds once ``snap`` is written."""
    return json.loads(layout.dump_json(snap))


def test_contract_example_round_trips_exactly(tmp_path) -> None:
    snap = parse(CONTRACT_EXAMPLE)
    assert written(snap) == CONTRACT_EXAMPLE
    rd = RunDir.open(tmp_path / "run")
    layout.PROGRESS_FILE.write(rd, snap)
    assert json.loads(rd.read_bytes(layout.PROGRESS) or b"") == CONTRACT_EXAMPLE
    assert layout.PROGRESS_FILE.read(rd) == snap


def test_parsed_values_and_totals() -> None:
    snap = parse(CONTRACT_EXAMPLE)
    assert snap.sources["sharegpt"].remaining == 58 + 1  # one new attempt still to store
    assert snap.sources["kimi"].regenerate is False
    assert snap.sources["kimi"].pending is None  # written before it: unknown, not zero
    o = snap.overall
    assert (o.total, o.done, o.failed, o.truncated) == (110, 50, 2, 3)
    assert o.completion_tokens == 55000 and o.remaining == 59
    assert snap.endpoints[1] == EndpointProgress(
        url="http://10.0.0.6:30000/v1",
        in_flight=8,
        healthy=False,
        health="stalled",
        stalls=3,
        latency_p50_s=None,
        ok=40,
        errors=5,
    )
    assert snap.token_series[-1] == (2010.0, 2100)
    assert snap.errors["timeout"].count == 4


def test_fresh_snapshot_serializes_to_the_full_shape() -> None:
    snap = ProgressSnapshot(name="n", model="m", session="s", host="h", pid=1)
    snap.sources["a"] = SourceProgress(total=5)
    d = written(snap)
    assert set(d) == set(CONTRACT_EXAMPLE)
    assert set(d["sources"]["a"]) == set(CONTRACT_EXAMPLE["sources"]["sharegpt"])
    assert len(d["output_tokens_hist"]["edges"]) == len(d["output_tokens_hist"]["counts"])
    assert parse(d) == snap
    assert snap.sources["a"].pending == SourceCounts()  # a writer knows: nothing pending


def test_histogram_bins_by_lower_bounds_last_open() -> None:
    h = OutputHistogram(edges=[0, 100, 1000], counts=[0, 0, 0])
    for n in (0, 99, 100, 999, 1000, 50_000):
        h.add(n)
    assert h.counts == [2, 2, 2]
    h.add(5, n=3)
    assert h.counts == [5, 2, 2]
    assert h.total == 9


def test_histogram_with_closed_bins_counts_overflow_in_last_bin() -> None:
    h = OutputHistogram(edges=[0, 100, 1000], counts=[0, 0])
    for n in (5, 150, 5000):
        h.add(n)
    assert h.counts == [1, 2]


def test_token_series_one_point_per_step_and_trimmed_to_window() -> None:
    snap = ProgressSnapshot(name="n", model="m", session="s", host="h", pid=1)
    for i in range(0, 2000):
        snap.add_token_point(float(i), i * 10)  # one call per second
    ts = [t for t, _ in snap.token_series]
    assert all(b - a == 5.0 for a, b in itertools.pairwise(ts))
    assert ts[-1] == 1995.0
    assert ts[0] >= 1995.0 - SERIES_WINDOW_S
    assert len(ts) <= SERIES_MAX_POINTS
    snap.add_token_point(1996.0, 19960, force=True)
    assert snap.token_series[-1] == (1996.0, 19960)


def test_record_error_counts_and_keeps_last_message() -> None:
    snap = ProgressSnapshot(name="n", model="m", session="s", host="h", pid=1)
    snap.record_error("timeout", "first", 1.0)
    snap.record_error("timeout", "second", 2.0)
    assert snap.errors["timeout"].count == 2
    assert snap.errors["timeout"].last_message == "second"
    assert snap.errors["timeout"].last_at == 2.0


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.update(version=2), "version 2 not supported"),
        (lambda d: d.update(state="sleeping"), "state: "),
        (lambda d: d.pop("name"), "missing field 'name'"),
        (lambda d: d["sources"]["sharegpt"].update(done="40"), "sources.sharegpt.done: "),
        (lambda d: d["sources"]["sharegpt"].update(regenerate=1), "sharegpt.regenerate: "),
        (lambda d: d.update(pid=True), "pid: "),
        (lambda d: d.update(token_series=[[1.0]]), "token_series.0"),
        (lambda d: d["output_tokens_hist"].update(counts=[1]), "output_tokens_hist: "),
        (lambda d: d["endpoints"][0].pop("url"), "endpoints.0: Value error, missing field 'url'"),
        (lambda d: d["sources"]["sharegpt"]["pending"].pop("rows"), "sharegpt.pending: "),
    ],
)
def test_bad_shapes_are_rejected_naming_the_field(mutate, needle: str) -> None:
    d = json.loads(json.dumps(CONTRACT_EXAMPLE))
    mutate(d)
    with pytest.raises(RunDirError, match=r"^progress\.json is damaged: ") as ei:
        parse(d)
    assert needle in str(ei.value)


def test_not_an_object_is_rejected(tmp_path) -> None:
    with pytest.raises(RunDirError):
        parse([1, 2])
    rd = RunDir.open(tmp_path / "run")
    rd.write_bytes_atomic(layout.PROGRESS, b'{"version": 1, "na')  # torn by storage
    with pytest.raises(RunDirError, match=r"progress\.json is damaged"):
        layout.PROGRESS_FILE.read(rd)


def test_keys_of_a_newer_writer_are_ignored() -> None:
    d = json.loads(json.dumps(CONTRACT_EXAMPLE))
    d["metrics"] = {"gpu": 1}
    d["sources"]["sharegpt"]["cache_hits"] = 3
    d["requests"]["hedged"] = 1
    assert written(parse(d)) == CONTRACT_EXAMPLE


def test_a_file_from_before_the_quality_counters_reads_them_as_zero() -> None:
    old = json.loads(json.dumps(CONTRACT_EXAMPLE))
    for src in old["sources"].values():
        for key in ("flagged", "flags", "retried", "retrying"):
            del src[key]
        for key in ("flagged", "flags", "retried"):
            src.get("pending", {}).pop(key, None)
    snap = parse(old)
    sp = snap.sources["sharegpt"]
    assert (sp.flagged, sp.flags, sp.retried, sp.retrying) == (0, {}, 0, 0)
    assert sp.pending is not None and (sp.pending.flagged, sp.pending.flags) == (0, {})
    assert sp.remaining == 58


def test_ended_conversations_are_written_only_when_some_ended_and_read_back() -> None:
    snap = parse(CONTRACT_EXAMPLE)
    sp = snap.sources["sharegpt"]
    assert sp.ended == {} and "ended" not in written(snap)["sources"]["sharegpt"]
    sp.ended = {"tool_call_name": 2}
    assert sp.pending is not None
    sp.pending.ended = {"tool_call_args": 1}
    d = written(snap)
    assert d["sources"]["sharegpt"]["ended"] == {"tool_call_name": 2}
    assert d["sources"]["sharegpt"]["pending"]["ended"] == {"tool_call_args": 1}
    assert "ended" not in d["sources"]["kimi"]
    again = parse(d)
    assert again == snap and again.overall.ended == {"tool_call_name": 2}


def test_mistyped_flag_counts_are_refused() -> None:
    bad = json.loads(json.dumps(CONTRACT_EXAMPLE))
    bad["sources"]["sharegpt"]["flags"]["repetition"] = "3"
    with pytest.raises(RunDirError, match=r"sources\.sharegpt\.flags"):
        parse(bad)
