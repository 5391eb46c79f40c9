"""regen.status: rates, ETA band and states from synthetic run directories (``now`` injected)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _runs import read_numbers

from regen.core.errors import RunDirError
from regen.devkit.synthetic import make_snapshot, write_run_dir
from regen.status import (
    STALL_AFTER_S,
    Rate,
    RunFiles,
    RunView,
    compute,
    last_growth_at,
    length_cv,
    window_rate,
)
from regen.store.counts import SourceCounts
from regen.store.layout import LockRecord
from regen.store.lock import CLOCK_SKEW_S, LOCK_STALE_S
from regen.store.progress import EndpointProgress, ProgressSnapshot, SourceProgress

NOW = 1_800_000_000.0
HOST = "node-a"


def series(rate_at, start: float, end: float, step: float = 5.0) -> list[tuple[float, int]]:
    """Cumulative tokens sampled every ``step`` s; ``rate_at(t)`` is the tok/s at time t."""
    out, total, t = [], 0.0, start
    while t <= end + 1e-9:
        out.append((t, round(total)))
        total += rate_at(t) * step
        t += step
    return out


def snap(**kw) -> ProgressSnapshot:
    s = ProgressSnapshot(name="run", model="m", session="s1", host=HOST, pid=123)
    s.run_started_at = NOW - 7200
    s.started_at = NOW - 3600
    s.updated_at = NOW - 1
    for k, v in kw.items():
        setattr(s, k, v)
    return s


def lock(
    beat_age: float = 2.0, host: str = HOST, pid: int = 123, session: str = "s1"
) -> LockRecord:
    return LockRecord(host=host, pid=pid, session=session, started_at=NOW - 3600,
                      heartbeat_at=NOW - beat_age)  # fmt: skip


def numbers(progress, lk, *, alive=True, **kw):
    return compute(RunFiles(progress, lk, None), now=NOW, hostname=HOST,
                   pid_alive=lambda pid: alive, **kw)  # fmt: skip


# ---- rates -----------------------------------------------------------------------------------


def test_constant_rate_is_the_same_over_every_window() -> None:
    s = series(lambda t: 100.0, NOW - 1200, NOW)
    for w in (60.0, 300.0, 900.0):
        r = window_rate(s, w)
        assert r.tok_s == pytest.approx(100.0)
        assert r.span_s == w


def test_windows_see_a_rate_change_differently() -> None:
    # 100 tok/s until 5 min ago, then 300 tok/s
    s = series(lambda t: 100.0 if t < NOW - 300 else 300.0, NOW - 1200, NOW)
    assert window_rate(s, 60).tok_s == pytest.approx(300.0)
    assert window_rate(s, 300).tok_s == pytest.approx(300.0)
    assert window_rate(s, 900).tok_s == pytest.approx((300 * 300 + 600 * 100) / 900)


def test_window_start_between_points_is_interpolated() -> None:
    s = [(0.0, 0), (10.0, 1000), (20.0, 1000), (30.0, 4000)]
    # last 25 s: from t=5 (value 500, interpolated) to t=30 (4000)
    assert window_rate(s, 25).tok_s == pytest.approx(3500 / 25)


def test_young_session_rates_cover_what_exists_and_too_short_is_none() -> None:
    s = series(lambda t: 50.0, NOW - 30, NOW)
    r = window_rate(s, 300)
    assert (r.tok_s, r.span_s) == (pytest.approx(50.0), 30.0)
    assert window_rate(series(lambda t: 50.0, NOW - 5, NOW), 60).tok_s is None
    assert window_rate([(NOW, 10)], 60) == Rate(60, None, 0.0)
    assert window_rate([], 60).tok_s is None


def test_last_growth_is_the_last_point_that_grew() -> None:
    assert last_growth_at([(0.0, 0), (5.0, 10), (10.0, 10), (15.0, 10)]) == 5.0
    assert last_growth_at([(0.0, 7), (5.0, 7)]) == 0.0
    assert last_growth_at([]) is None


def test_length_cv_from_histogram() -> None:
    # two equal bins with midpoints 50 and 150: mean 100, std 50
    assert length_cv([0, 100, 200], [5, 5]) == pytest.approx(0.5)
    assert length_cv([0, 100], [0, 0]) == 1.0


# ---- ETA -------------------------------------------------------------------------------------


def two_sources() -> dict[str, SourceProgress]:
    return {
        # observed: 100 done, 200 turns x 500 tokens = 1000 tokens per sample; 400 remain
        "a": SourceProgress(total=510, done=100, failed=10, rows=200, completion_tokens=100_000),
        # no data yet: the manifest's output_tokens decide
        "b": SourceProgress(total=100),
        # native: costs no tokens
        "n": SourceProgress(total=50, done=0, regenerate=False),
    }


def test_eta_combines_observed_lengths_and_manifest_assumption() -> None:
    p = snap(sources=two_sources(), token_series=series(lambda t: 100.0, NOW - 1200, NOW))
    n = numbers(p, lock(), assumptions={"b": (200, 600)})
    e = n.eta
    assert e is not None
    assert e.tokens == pytest.approx(400 * 1000 + 100 * 400)
    rel = 2.0 * 1.0 / math.sqrt(200)  # cv 1.0 (empty histogram), 200 turns seen
    assert e.tokens_low == pytest.approx(400 * 1000 * (1 - rel) + 100 * 200)
    assert e.tokens_high == pytest.approx(400 * 1000 * (1 + rel) + 100 * 600)
    assert e.seconds == pytest.approx(440_000 / 100)
    assert e.low_s == pytest.approx(e.tokens_low / 100) and e.high_s == pytest.approx(
        e.tokens_high / 100
    )
    assert e.assumed_sources == ["b"]
    assert n.remaining == 400 + 100 + 50


def test_eta_band_widens_with_the_spread_of_rates() -> None:
    # 100 tok/s until 5 min ago, then 300: 1 min/5 min see 300, 15 min sees 166.7
    s = series(lambda t: 100.0 if t < NOW - 300 else 300.0, NOW - 1200, NOW)
    p = snap(sources=two_sources(), token_series=s)
    e = numbers(p, lock(), assumptions={"b": (200, 600)}).eta
    assert e is not None
    assert e.rate_tok_s == pytest.approx(300.0)  # the 5-minute rate
    assert e.seconds == pytest.approx(e.tokens / 300.0)
    assert e.low_s == pytest.approx(e.tokens_low / 300.0)
    assert e.high_s == pytest.approx(e.tokens_high / ((300 * 300 + 600 * 100) / 900))
    assert e.low_s < e.seconds < e.high_s


def test_eta_without_any_data_uses_default_assumption_for_every_source() -> None:
    sources = {"a": SourceProgress(total=10), "b": SourceProgress(total=30)}
    p = snap(sources=sources, token_series=series(lambda t: 10.0, NOW - 600, NOW))
    e = numbers(p, lock(), assumptions={}).eta
    assert e is not None
    assert e.assumed_sources == ["a", "b"]
    assert e.tokens == pytest.approx(40 * 1000)  # (600 + 1400) / 2 per sample
    assert (e.tokens_low, e.tokens_high) == (40 * 600, 40 * 1400)


def test_narrow_histogram_gives_a_narrower_length_band() -> None:
    sources = {"a": SourceProgress(total=1100, done=100, rows=100, completion_tokens=50_000)}
    s = series(lambda t: 100.0, NOW - 1200, NOW)
    wide = numbers(snap(sources=sources, token_series=s), lock()).eta
    p = snap(sources=sources, token_series=s)
    p.output_tokens_hist.edges, p.output_tokens_hist.counts = [0, 490, 510], [0, 100, 0]
    narrow = numbers(p, lock()).eta
    assert wide is not None and narrow is not None
    assert narrow.tokens == wide.tokens
    assert narrow.tokens_high - narrow.tokens_low < (wide.tokens_high - wide.tokens_low) / 10


def test_eta_is_none_without_a_rate_and_zero_when_nothing_remains() -> None:
    p = snap(sources=two_sources(), token_series=[])
    assert numbers(p, lock()).eta is None
    done = {"a": SourceProgress(total=5, done=4, failed=1, rows=4, completion_tokens=40)}
    p = snap(sources=done, token_series=series(lambda t: 1.0, NOW - 600, NOW))
    e = numbers(p, lock()).eta
    assert e is not None and e.seconds == 0.0 and e.tokens == 0.0


# ---- states ----------------------------------------------------------------------------------


def growing() -> list[tuple[float, int]]:
    return series(lambda t: 100.0, NOW - 1200, NOW - 2)


def flat_since(t_flat: float) -> list[tuple[float, int]]:
    return series(lambda t: 100.0 if t < t_flat else 0.0, NOW - 1200, NOW - 2)


def test_running_when_holder_alive_and_tokens_grow() -> None:
    n = numbers(snap(token_series=growing()), lock())
    assert (n.state, n.state_reason) == ("running", "")
    assert n.holder is not None and n.holder.alive


def test_stalled_when_holder_alive_but_no_new_tokens() -> None:
    n = numbers(snap(token_series=flat_since(NOW - 400)), lock(), stall_after_s=300)
    assert n.state == "stalled"
    assert "no new tokens" in n.state_reason
    # the same directory is still running under a more patient threshold
    assert numbers(snap(token_series=flat_since(NOW - 400)), lock(), stall_after_s=600).state == (
        "running"
    )


def test_stalled_when_progress_json_stops_being_updated() -> None:
    n = numbers(snap(token_series=growing(), updated_at=NOW - STALL_AFTER_S - 5), lock())
    assert n.state == "stalled"
    assert "progress.json" in n.state_reason


def test_young_session_without_tokens_yet_is_running() -> None:
    p = snap(started_at=NOW - 60, token_series=[(NOW - 55, 0), (NOW - 5, 0)])
    assert numbers(p, lock()).state == "running"


def test_dead_when_heartbeat_is_stale() -> None:
    eps = [EndpointProgress(url="http://127.0.0.1:1/v1", in_flight=5)]
    p = snap(sources=two_sources(), token_series=growing(), endpoints=eps, in_flight=5)
    assert numbers(p, lock()).endpoints[0].in_flight == 5
    n = numbers(p, lock(beat_age=LOCK_STALE_S + 1))
    assert n.state == "dead"
    assert "heartbeat" in n.state_reason
    assert n.in_flight == 0 and n.endpoints[0].in_flight == 0
    assert n.eta is None


def test_dead_when_pid_is_gone_on_this_host() -> None:
    n = numbers(snap(token_series=growing()), lock(), alive=False)
    assert n.state == "dead"
    assert "pid 123" in n.state_reason


def test_pid_on_another_host_is_not_checked() -> None:
    n = numbers(snap(token_series=growing()), lock(host="node-b"), alive=False)
    assert n.state == "running"


def test_dead_when_lock_is_gone_but_progress_says_running() -> None:
    n = numbers(snap(token_series=growing()), None)
    assert (n.state, n.state_reason) == ("dead", "lock.json is gone")


@pytest.mark.parametrize("final", ["finished", "interrupted", "failed"])
def test_final_states_come_from_the_driver(final: str) -> None:
    n = numbers(snap(state=final, token_series=growing()), None)
    assert n.state == final
    assert n.elapsed_s == pytest.approx(7200 - 1)  # up to the last update, not to now


def test_new_session_holding_the_lock_is_starting() -> None:
    n = numbers(snap(state="interrupted"), lock(session="s2"))
    assert n.state == "starting"
    n = numbers(snap(state="running", token_series=growing()), lock(session="s2"))
    assert n.state == "starting"


def test_no_progress_yet() -> None:
    assert numbers(None, lock()).state == "starting"
    assert numbers(None, None).state == "empty"


def test_real_pid_check_on_this_host(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    gone_pid = int(done.stdout)
    p = snap(token_series=growing())
    alive = compute(RunFiles(p, lock(pid=os.getpid()), None), now=NOW, hostname=HOST)
    dead = compute(RunFiles(p, lock(pid=gone_pid), None), now=NOW, hostname=HOST)
    assert (alive.state, dead.state) == ("running", "dead")


# ---- the run directory -------------------------------------------------------------------------


def test_numbers_from_a_synthetic_run_directory(tmp_path: Path) -> None:
    s = make_snapshot(NOW, host=HOST)
    write_run_dir(tmp_path, s, now=NOW, output_tokens={"sharegpt": (100, 200)})
    view = RunView(tmp_path)
    assert view.assumptions["sharegpt"] == (100, 200)
    n = view.numbers(NOW, hostname=HOST, pid_alive=lambda pid: True)
    assert n.state == "running"
    o, so = n.overall, s.overall
    assert (o.total, o.done, o.failed, o.truncated) == (so.total, so.done, so.failed, so.truncated)
    assert o.completion_tokens == so.completion_tokens
    assert [x.name for x in n.sources] == list(s.sources)
    assert n.rate(300.0) == pytest.approx(2300.0, rel=0.05)
    assert n.errors[0].kind == "server_error" and n.errors[0].count == 183
    assert n.in_flight == 127
    d = json.loads(json.dumps(n.to_dict()))
    assert d["done"] == s.overall.done and d["state"] == "running" and d["eta"]["seconds"] > 0


def test_a_tick_reads_only_the_three_small_files(tmp_path: Path, monkeypatch) -> None:
    from regen.store import RunDir

    write_run_dir(tmp_path, make_snapshot(NOW), now=NOW)
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "x.parquet").write_bytes(b"not parquet")
    view = RunView(tmp_path)
    view.numbers(NOW)  # the first tick also reads manifest.yaml, once
    seen: list[str] = []
    orig = RunDir.read_bytes

    def spy(self, rel: str):
        seen.append(rel)
        return orig(self, rel)

    monkeypatch.setattr(RunDir, "read_bytes", spy)
    monkeypatch.setattr(RunDir, "list", lambda *a, **k: pytest.fail("a tick must not list"))
    monkeypatch.setattr(RunDir, "sizes", lambda *a, **k: pytest.fail("listed before it was due"))
    for _ in range(3):
        view.numbers(NOW)
    assert sorted(seen) == sorted(["lock.json", "progress.json", "run.json"] * 3)


def _run_with_parts(root: Path, parts: int = 3, per_part: int = 4):
    """A finished run directory with real parts and records, and its progress snapshot."""
    import pyarrow as pa

    from regen.store import RunDir
    from regen.store.completed import CompletedSample
    from regen.store.segments import Journal

    rd = RunDir.open(root)
    j = Journal(rd, "S1", pa.Table.from_pylist)
    for i in range(parts * per_part):
        rows = [{"sample_id": f"a:{i}", "source": "a", "turn": 0, "prompt_tokens": 2,
                 "completion_tokens": 10, "finish_reason": "stop"}]  # fmt: skip
        j.append(CompletedSample(f"a:{i}", "a", rows))
        if (i + 1) % per_part == 0:
            j.roll()
    n = parts * per_part
    s = snap(state="finished", sources={"a": SourceProgress(
        total=n + 5, done=n, rows=n, prompt_tokens=2 * n, completion_tokens=10 * n,
        pending=SourceCounts())})  # fmt: skip
    write_run_dir(root, s, now=NOW, lock="none")
    return rd, n


def test_a_vanished_or_cut_part_is_not_counted(tmp_path: Path) -> None:
    from regen.store import layout
    from regen.store.parts import list_parts

    rd, n = _run_with_parts(tmp_path)
    assert RunView(tmp_path).numbers(NOW).overall.done == n
    first, second = (st.part for st in list_parts(rd)[:2])
    (tmp_path / first).unlink()
    data = (tmp_path / second).read_bytes()
    (tmp_path / second).write_bytes(data[:100])
    got = RunView(tmp_path).numbers(NOW)
    assert got.overall.done == n - 8 and got.overall.completion_tokens == 10 * (n - 8)
    assert got.remaining == got.overall.total - got.overall.done
    assert [d.split(":")[0] for d in got.damaged] == [first, second]
    # journaled samples not yet in a part still count
    s = layout.PROGRESS_FILE.read(rd)
    s.sources["a"].done += 3
    s.sources["a"].pending.done = 3
    layout.PROGRESS_FILE.write(rd, s)
    assert RunView(tmp_path).numbers(NOW).overall.done == n - 8 + 3


def test_counters_that_grew_since_the_last_listing_are_shown(tmp_path: Path) -> None:
    import pyarrow as pa

    from regen.store import layout
    from regen.store.completed import CompletedSample
    from regen.store.parts import list_parts
    from regen.store.segments import Journal

    rd, n = _run_with_parts(tmp_path)
    (tmp_path / list_parts(rd)[0].part).unlink()  # 4 samples gone
    view = RunView(tmp_path, reconcile_every_s=3600.0)  # lists on the first tick only
    assert view.numbers(NOW).overall.done == n - 4
    j = Journal(rd, "S2", pa.Table.from_pylist)  # the run goes on: a new part of 2 samples
    for i in range(2):
        j.append(CompletedSample(f"a:new{i}", "a", [{"sample_id": f"a:new{i}", "source": "a",
                                                     "turn": 0}]))  # fmt: skip
    j.roll()
    s = layout.PROGRESS_FILE.read(rd)
    s.sources["a"].done += 2
    layout.PROGRESS_FILE.write(rd, s)
    assert view.numbers(NOW).overall.done == n - 4 + 2  # not re-listed: the vanished part still out


def test_a_reconcile_never_opens_a_parquet_file(tmp_path: Path, monkeypatch) -> None:
    import pyarrow.parquet as pq

    from regen.store import RunDir

    _run_with_parts(tmp_path)
    opened: list[str] = []
    orig = RunDir.read_bytes

    def spy(self, rel: str):
        opened.append(rel)
        return orig(self, rel)

    monkeypatch.setattr(RunDir, "read_bytes", spy)
    for name in ("ParquetFile", "read_table", "read_metadata", "read_schema"):
        monkeypatch.setattr(pq, name, lambda *a, **k: pytest.fail("a tick read Parquet"))
    view = RunView(tmp_path, reconcile_every_s=0.0)  # every tick reconciles
    for _ in range(3):
        view.numbers(NOW)
    assert not [r for r in opened if r.endswith(".parquet")]
    records = [r for r in opened if r.startswith("parts/")]
    assert len(records) == 3 and len(set(records)) == 3  # each record read once, then cached


def test_manifest_written_after_the_monitor_opened_is_picked_up(tmp_path: Path) -> None:
    write_run_dir(tmp_path, make_snapshot(NOW), now=NOW, output_tokens={"xlam": (10, 20)})
    manifest = (tmp_path / "manifest.yaml").read_text()
    (tmp_path / "manifest.yaml").unlink()
    view = RunView(tmp_path)
    assert view.assumptions == {}
    (tmp_path / "manifest.yaml").write_text(manifest)
    assert view.assumptions["xlam"] == (10, 20)


def test_pyarrow_uri_and_missing_directories(tmp_path: Path) -> None:
    write_run_dir(tmp_path / "run", make_snapshot(NOW, state="finished"), now=NOW, lock="none")
    n = read_numbers(f"file://{tmp_path / 'run'}", NOW)
    assert n.state == "finished" and n.overall.total == 88_088
    with pytest.raises(RunDirError, match="does not exist"):
        RunView(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDirError, match="not a run directory"):
        read_numbers(tmp_path / "empty", NOW)


def test_progress_of_another_version_is_unknown_and_says_so(tmp_path: Path) -> None:
    write_run_dir(tmp_path, make_snapshot(NOW), now=NOW)
    d = json.loads((tmp_path / "progress.json").read_text())
    d["version"] = 99
    (tmp_path / "progress.json").write_text(json.dumps(d))
    n = read_numbers(tmp_path, NOW)
    assert n.state == "unknown"
    assert "another regen version (format 99" in n.state_reason
    assert "--repair" not in n.state_reason  # not damage: nothing to repair


def _stored_run(tmp_path: Path) -> Path:
    """A finished run directory as the store writes it: two parts with records, plan.json,
    progress.json (12 samples of sources a and b, all done)."""
    from regen.core.sample import Sample
    from regen.engine.rows import native_row
    from regen.store import RunDir, layout
    from regen.store.completed import CompletedSample
    from regen.store.layout import PlanEntry, PlanRecord
    from regen.store.segments import Journal

    rd = RunDir.open(tmp_path / "run")
    j = Journal(rd, "S1")
    for i in range(12):
        src = "a" if i < 8 else "b"
        sample = Sample(f"{src}:{i}", src, [], mode="native", input_ids=list(range(10)),
                        loss_mask=[0] * 3 + [1] * 7)  # fmt: skip
        j.append(CompletedSample(sample.id, src, [native_row(sample)]))
        if i % 6 == 5:
            j.roll()
    layout.PLAN_FILE.write(
        rd,
        PlanRecord(
            sources={
                "a": PlanEntry(total=8, regenerate=True),
                "b": PlanEntry(total=4, regenerate=True),
            }
        ),
    )
    layout.RUN_FILE.write(rd, layout.RunRecord(name="r", fingerprint="f", model="m",
                                               created_at=NOW - 60, regen_version="0"))  # fmt: skip
    s = make_snapshot(NOW)
    s.state = "finished"
    s.sources = {"a": SourceProgress(total=8, done=8, rows=8, prompt_tokens=24,
                                     completion_tokens=56),
                 "b": SourceProgress(total=4, done=4, rows=4, prompt_tokens=12,
                                     completion_tokens=28)}  # fmt: skip
    layout.PROGRESS_FILE.write(rd, s)
    return tmp_path / "run"


@pytest.mark.parametrize("garbage", [b"garbage{", b"", b'{"version": 1, "name": 3}'])
def test_a_damaged_progress_file_reads_as_unknown_not_as_an_empty_run(
    tmp_path: Path, garbage: bytes, capsys
) -> None:
    from monitor.render import render_text
    from regen.cli.main import main

    run = _stored_run(tmp_path)
    (run / "progress.json").write_bytes(garbage)
    n = read_numbers(run, NOW)
    assert n.state == "unknown"
    assert "progress.json is damaged" in n.state_reason
    assert f"regen verify {run} --repair" in n.state_reason
    # the numbers are the part records', with the plan's totals: not 0/0
    assert (n.overall.done, n.overall.total, n.overall.rows) == (12, 12, 12)
    assert {s.name: (s.done, s.total) for s in n.sources} == {"a": (8, 8), "b": (4, 4)}
    frame = render_text(n, width=160)
    assert "UNKNOWN" in frame and "--repair" in frame and "EMPTY" not in frame
    assert main(["status", str(run), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["state"] == "unknown" and d["done"] == 12 and d["total"] == 12
    assert main(["status", str(run)]) == 1
    out = capsys.readouterr().out
    assert "progress unknown" in out and "--repair" in out
    assert main(["verify", str(run), "--repair", "--no-plan"]) == 0
    capsys.readouterr()
    fixed = read_numbers(run, NOW)
    assert fixed.state == "finished" and (fixed.overall.done, fixed.overall.total) == (12, 12)
    assert main(["status", str(run)]) == 0


def test_a_deleted_progress_file_beside_stored_parts_is_unknown_too(tmp_path: Path) -> None:
    run = _stored_run(tmp_path)
    (run / "progress.json").unlink()
    n = read_numbers(run, NOW)
    assert n.state == "unknown" and "progress.json is missing" in n.state_reason
    assert (n.overall.done, n.overall.total) == (12, 12)


def test_configured_endpoints_without_reports_are_listed_unknown(tmp_path: Path) -> None:
    s = make_snapshot(NOW)
    s.endpoints = s.endpoints[:1]
    write_run_dir(tmp_path, s, now=NOW)
    n = read_numbers(tmp_path, NOW)
    assert [e.healthy for e in n.endpoints] == [True, None, None]
    assert [e.url for e in n.endpoints] == s.endpoints_configured


# ---- `regen status` ------------------------------------------------------------------------


def test_status_json_carries_the_numbers(tmp_path: Path, capsys) -> None:
    from regen.cli.main import main

    now = __import__("time").time()
    s = make_snapshot(now)
    write_run_dir(tmp_path, s, now=now)
    assert main(["status", str(tmp_path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["state"] == "running"
    o = s.overall
    assert (d["total"], d["done"], d["failed"], d["truncated"]) == (
        o.total, o.done, o.failed, o.truncated
    )  # fmt: skip
    assert d["completion_tokens"] == o.completion_tokens
    assert {x["name"]: x["done"] for x in d["sources"]} == {k: v.done for k, v in s.sources.items()}
    assert [r["window_s"] for r in d["rates"]] == [60.0, 300.0, 900.0]
    assert d["eta"]["low_s"] < d["eta"]["seconds"] < d["eta"]["high_s"]


def test_ended_conversations_are_counted_per_source_and_overall_most_first() -> None:
    sources = {
        "a": SourceProgress(total=10, done=4, ended={"tool_call_args": 2, "tool_call_name": 1}),
        "b": SourceProgress(total=5, done=5, ended={"tool_call_name": 3}),
        "c": SourceProgress(total=3, done=1),
    }
    n = numbers(snap(sources=sources, state="running"), lock())
    assert list(n.overall.ended.items()) == [("tool_call_name", 4), ("tool_call_args", 2)]
    assert {s.name: list(s.ended.items()) for s in n.sources} == {
        "a": [("tool_call_args", 2), ("tool_call_name", 1)],
        "b": [("tool_call_name", 3)],
        "c": [],
    }
    d = n.to_dict()
    assert list(d["ended"].items()) == [("tool_call_name", 4), ("tool_call_args", 2)]
    assert {x["name"]: x["ended"] for x in d["sources"]} == {  # the key even when empty
        "a": {"tool_call_args": 2, "tool_call_name": 1},
        "b": {"tool_call_name": 3},
        "c": {},
    }


def test_status_text_summary_and_table(tmp_path: Path, capsys) -> None:
    from regen.cli.main import main

    write_run_dir(tmp_path, make_snapshot(NOW, state="interrupted"), now=NOW, lock="none")
    assert main(["status", f"file://{tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kimi-k25-eagle3-regen interrupted | 44,831/88,088 (51.0%)")
    assert "completion tokens 109.0M" in out
    assert "swe_gym" in out and "TOTAL" in out


def test_status_of_a_missing_directory_is_one_clean_error(tmp_path: Path, capsys) -> None:
    from regen.cli.main import main

    assert main(["status", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err


def test_assumed_length_is_per_turn_times_expected_turns_per_sample() -> None:
    p = snap(sources=two_sources(), token_series=series(lambda t: 100.0, NOW - 1200, NOW))
    e = numbers(p, lock(), assumptions={"b": (200, 600)}, turns={"b": 3.0}).eta
    assert e is not None
    assert e.tokens == pytest.approx(400 * 1000 + 100 * 400 * 3)
    rel = 2.0 / math.sqrt(200)
    assert e.tokens_low == pytest.approx(400 * 1000 * (1 - rel) + 100 * 200 * 3)
    assert e.tokens_high == pytest.approx(400 * 1000 * (1 + rel) + 100 * 600 * 3)


def test_run_view_reads_turns_from_plan_json_once(tmp_path: Path) -> None:
    sources = {"a": SourceProgress(total=10), "b": SourceProgress(total=10)}
    s = snap(sources=sources, token_series=series(lambda t: 10.0, NOW - 600, NOW))
    write_run_dir(tmp_path, s, now=NOW, output_tokens={"a": (100, 100), "b": (100, 100)})
    plan = {
        "a": {
            "total": 10,
            "regenerate": True,
            "native": 0,
            "regenerate_todo": 10,
            "regenerate_turns": 25,
        },
        "b": {"total": 10, "regenerate": True, "native": 0},  # older driver: no turn count
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))  # the flat shape of older drivers
    view = RunView(tmp_path)
    assert view.turns == {"a": 2.5}
    e = view.numbers(NOW, hostname=HOST, pid_alive=lambda pid: True).eta
    assert e is not None and e.tokens == pytest.approx(10 * 100 * 2.5 + 10 * 100)


def test_a_driver_on_another_host_gets_a_clock_skew_allowance() -> None:
    """Heartbeat and token times are the driver's clock; the monitor's may run ahead."""
    age = LOCK_STALE_S + CLOCK_SKEW_S / 2
    here = numbers(snap(token_series=growing()), lock(beat_age=age))
    assert here.state == "dead"  # same host: one clock, no allowance
    there = numbers(snap(token_series=growing(), host="node-b"), lock(beat_age=age, host="node-b"))
    assert there.state == "running"
    gone = numbers(
        snap(token_series=growing(), host="node-b"),
        lock(beat_age=LOCK_STALE_S + CLOCK_SKEW_S + 1, host="node-b"),
    )
    assert gone.state == "dead"
    flat = flat_since(NOW - STALL_AFTER_S - CLOCK_SKEW_S / 2)
    assert numbers(snap(token_series=flat), lock()).state == "stalled"
    remote = numbers(snap(token_series=flat, host="node-b"), lock(host="node-b"))
    assert remote.state == "running"


def test_status_text_and_json_carry_the_flagged_counts(tmp_path: Path, capsys) -> None:
    from regen.cli.main import main

    s = make_snapshot(NOW, state="interrupted")
    write_run_dir(tmp_path, s, now=NOW, lock="none")
    assert main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    flagged = sum(v.flagged for v in s.sources.values())
    assert f"flagged {flagged:,} samples (rows per flag: repetition" in out
    assert main(["status", str(tmp_path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["flagged"] == flagged
    assert {x["name"]: x["flagged"] for x in d["sources"]} == {
        k: v.flagged for k, v in s.sources.items()
    }
    assert list(d["flags"].values()) == sorted(d["flags"].values(), reverse=True)


def test_the_flagged_samples_of_a_vanished_part_are_not_counted(tmp_path: Path) -> None:
    import pyarrow as pa

    from regen.store import RunDir
    from regen.store.completed import CompletedSample
    from regen.store.doneset import read_done
    from regen.store.parts import list_parts
    from regen.store.segments import Journal

    rd = RunDir.open(tmp_path)
    j = Journal(rd, "S1", pa.Table.from_pylist)
    for i in range(8):
        flags = ["repetition"] if i % 2 else []
        j.append(CompletedSample(f"a:{i}", "a", [{"sample_id": f"a:{i}", "source": "a",
                 "turn": 0, "completion_tokens": 5, "quality_flags": flags}]))  # fmt: skip
        if i % 4 == 3:
            j.roll()
    sp = SourceProgress(total=8, pending=SourceCounts())
    sp.add(read_done(rd).sources["a"])
    write_run_dir(tmp_path, snap(state="finished", sources={"a": sp}), now=NOW, lock="none")
    got = RunView(tmp_path).numbers(NOW)
    assert (got.overall.flagged, got.overall.flags) == (4, {"repetition": 4})
    (tmp_path / list_parts(rd)[0].part).unlink()
    got = RunView(tmp_path).numbers(NOW)
    assert (got.overall.done, got.overall.flagged, got.overall.flags) == (4, 2, {"repetition": 2})
