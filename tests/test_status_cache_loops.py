"""Loop cuts and the prefix cache in every view of a run: `regen status --json`, the
dashboard (its endpoints panel and its errors panel), the log line and regen's metrics.

The counters start where the rows are (regen.store.counts.count_rows: a ``loop`` row, a row
whose server reported ``cached_tokens``) and where the workers are (each endpoint's prompt and
cached tokens, folded by the driver's tracker); the views must show the same numbers.
"""

from __future__ import annotations

import json

from monitor.plain import log_line
from monitor.render import render_text
from regen.core.result import LOOP
from regen.engine.metrics import values
from regen.engine.tracker import ProgressTracker
from regen.status import RunFiles, compute
from regen.store import RunDir
from regen.store.counts import count_rows
from regen.store.progress import EndpointProgress, ProgressSnapshot, SourceProgress

NOW = 1_790_000_000.0


def row(**kw: object) -> dict[str, object]:
    base = {"prompt_tokens": 1000, "completion_tokens": 100, "finish_reason": "stop",
            "quality_flags": [], "cached_tokens": None, "cut_saved": None}  # fmt: skip
    return {**base, **kw}


def test_rows_count_cuts_and_cache() -> None:
    c = count_rows([row(cached_tokens=600), row(finish_reason=LOOP, cut_saved=1900,
                   quality_flags=["repetition"], completion_tokens=148), row()])  # fmt: skip
    assert (c.loop_cut, c.cut_saved) == (1, 1900)
    assert (c.cache_prompt_tokens, c.cached_tokens) == (1000, 600)
    assert c.cache_hit_rate == 0.6
    assert count_rows([row()]).cache_hit_rate is None  # no server reported its cache
    # a file of the counters leaves them out while 0 (older readers see what they knew)
    assert "loop_cut" not in count_rows([row()]).model_dump()


def test_the_tracker_folds_each_endpoints_cache_over_workers_and_sessions(tmp_path) -> None:
    rd = RunDir.open(tmp_path / "run")
    rd.create()
    url = "http://10.0.0.5:30000/v1"
    t = ProgressTracker(rd, name="r", model="m", session="s1", run_started_at=NOW,
                        endpoints=[url])  # fmt: skip
    ep = {"in_flight": 0, "ok": 3, "failures": 0, "throttled": 0, "state": "up"}
    worker = {"in_flight": 0, "sent": 3, "ok": 3, "retried": 0, "failed": 0, "errors": {},
              "endpoints": {url: ep}, "latencies": {}}  # fmt: skip
    t.workers([{**worker, "cache": {url: [1000, 400]}}, {**worker, "cache": {url: [500, 350]}}])
    (e,) = t.snap.endpoints
    assert (e.cache_prompt_tokens, e.cached_tokens) == (1500, 750)
    t.write("finished")
    again = ProgressTracker(rd, name="r", model="m", session="s2", run_started_at=NOW,
                            endpoints=[url])  # fmt: skip
    again.carry_over(t.snap)
    again.workers([{**worker, "cache": {url: [100, 100]}}])
    (e,) = again.snap.endpoints
    assert (e.cache_prompt_tokens, e.cached_tokens) == (1600, 850)


def numbers():
    s = ProgressSnapshot(name="run", model="m", session="s1", host="h", pid=1)
    s.run_started_at, s.started_at, s.updated_at = NOW - 600, NOW - 600, NOW - 1
    s.state = "finished"
    swe = SourceProgress(total=10, done=10, rows=40, prompt_tokens=40_000,
                         completion_tokens=4_000, loop_cut=2, cut_saved=30_000,
                         cache_prompt_tokens=40_000, cached_tokens=30_000,
                         regenerate=True)  # fmt: skip
    chat = SourceProgress(total=5, done=5, rows=5, prompt_tokens=500, completion_tokens=900,
                          regenerate=True)  # fmt: skip
    s.sources = {"swe_gym": swe, "sharegpt": chat}
    s.endpoints = [
        EndpointProgress(url="http://a:1/v1", ok=30, cache_prompt_tokens=30_000,
                         cached_tokens=27_000),
        EndpointProgress(url="http://b:1/v1", ok=15),
    ]  # fmt: skip
    return compute(RunFiles(s, None, None), now=NOW, hostname="h", pid_alive=lambda p: False)


def test_status_json_has_the_cache_and_the_cuts() -> None:
    d = json.loads(json.dumps(numbers().to_dict()))
    assert (d["loop_cut"], d["cut_saved"]) == (2, 30_000)
    assert d["cache_hit_rate"] == 30_000 / 40_000
    by = {s["name"]: s for s in d["sources"]}
    assert (by["swe_gym"]["loop_cut"], by["swe_gym"]["cut_saved"]) == (2, 30_000)
    assert (by["sharegpt"]["loop_cut"], by["sharegpt"]["cache_hit_rate"]) == (0, None)
    eps = {e["url"]: e for e in d["endpoints"]}
    assert eps["http://a:1/v1"]["cache_hit_rate"] == 0.9
    assert eps["http://b:1/v1"]["cache_hit_rate"] is None


def test_the_dashboard_and_the_log_line_show_them() -> None:
    n = numbers()
    text = render_text(n, width=140)
    assert "loops cut while streaming: 2 answers, 30.0K tokens spared" in text
    assert "swe_gym 2 (30.0K tok)" in text
    assert "90%" in text  # endpoint a's cache
    line = log_line(n)
    assert "loops cut 2 (30.0K tok spared)" in line and "cache 75%" in line


def test_metrics_carry_them() -> None:
    v = values(numbers())
    assert ({"source": "swe_gym"}, 2) in v["regen_loops_cut"]
    assert ({"source": "swe_gym"}, 30_000) in v["regen_loop_tokens_spared"]
    assert ({"endpoint": "http://a:1/v1"}, 0.9) in v["regen_endpoint_cache_hit_rate"]
    assert ({"endpoint": "http://a:1/v1"}, 27_000) in v["regen_endpoint_cached_tokens"]
    assert all(t["endpoint"] != "http://b:1/v1" for t, _ in v["regen_endpoint_cache_hit_rate"])
