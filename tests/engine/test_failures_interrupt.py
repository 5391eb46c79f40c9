"""Driver on a real Ray head: permanent failures recorded and skipped (until --retry-failed),
and a stop request (what SIGINT/SIGTERM set) that leaves a clean, resumable directory."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest

from regen.devkit.simulate.testing import simulator_in_thread
from regen.engine import RunOptions, run_job
from regen.manifest import load_manifest
from regen.store import RunDir
from regen.store.doneset import read_done
from regen.store.failures import read_failures
from regen.store.layout import LOCK as LOCK_FILE

pytestmark = pytest.mark.ray

DEMO = Path(__file__).resolve().parents[2] / "manifests" / "demo.yaml"
#: prompt + 48 completion tokens must fit: the long prompts (tools, agent traces) do not
CONTEXT = 150
SECRET = "sk-regen-test-0123456789"


def test_permanent_failures_skipped_until_retry_failed(
    ray_head, tmp_path, monkeypatch, capfd
) -> None:
    monkeypatch.setenv("REGEN_TEST_KEY", SECRET)
    out = str(tmp_path / "run")
    with simulator_in_thread(model_name="demo-target", instant=True, mean_tokens=16,
                             context_length=CONTEXT) as sim:  # fmt: skip
        # the endpoint's key comes from the environment and must never be written anywhere
        m = load_manifest(DEMO, [f"endpoints=[{{url: '{sim.url}', api_key_env: REGEN_TEST_KEY}}]",
                                 "engine.workers=1"])  # fmt: skip
        opts = RunOptions(address=ray_head.address, handle_signals=False)
        first = run_job(m, RunDir.open(out, create=False), opts)
        rd = RunDir.open(out)
        fails = read_failures(rd)
        permanent = {k for k, f in fails.items() if f.permanent}
        assert permanent and all(fails[k].status == 400 for k in permanent)
        assert first.state == "finished" and first.failed_transient == 0
        assert first.failed_permanent == len(permanent)
        assert first.done == first.total - len(permanent)
        assert read_done(rd).ids.isdisjoint(permanent)
        progress = rd.read_json("progress.json")
        assert sum(s["failed"] for s in progress["sources"].values()) == len(permanent)

        received = sim.stats()["received"]
        again = run_job(
            m, RunDir.open(out, create=False), opts
        )  # nothing to do: done ones and permanent ones skipped
        assert again.completed_now == 0 and again.failed_permanent == len(permanent)
        assert sim.stats()["received"] == received

        retry = run_job(
            m,
            RunDir.open(out, create=False),
            RunOptions(address=ray_head.address, retry_failed=True, handle_signals=False),
        )
        assert sim.stats()["received"] >= received + len(permanent)
        assert retry.failed_permanent == len(permanent) and retry.completed_now == 0
    for f in Path(out).rglob("*"):
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), f
    captured = capfd.readouterr()
    assert SECRET not in captured.out + captured.err


def test_stop_writes_a_part_releases_the_lock_and_resumes(ray_head, tmp_path, caplog) -> None:
    m = load_manifest(DEMO, ["engine.part_size=1000", "engine.part_interval_s=1000",
                             "engine.workers=1"])  # fmt: skip
    out = tmp_path / "run"
    rd = RunDir.open(out)
    stop = threading.Event()
    with simulator_in_thread(model_name="demo-target", max_running_requests=2, step_ms=5,
                             mean_tokens=30) as sim:  # fmt: skip

        def stopper() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not stop.is_set():
                journal = [n for n in rd.list("journal") if n.endswith(".jsonl")]
                if journal and rd.size(f"journal/{journal[0]}") > 0:
                    time.sleep(0.5)
                    stop.set()
                time.sleep(0.05)

        t = threading.Thread(target=stopper, daemon=True)
        t.start()
        opts = RunOptions(endpoints=[sim.url], address=ray_head.address, stop=stop,
                          handle_signals=False)  # fmt: skip
        summary = run_job(m, RunDir.open(out, create=False), opts)
        t.join(timeout=5)
        assert summary.state == "interrupted"
        assert 0 < summary.completed_now < summary.total
        assert not rd.exists(LOCK_FILE)
        assert rd.list("journal") == []  # folded into a part on the way out
        assert len(read_done(rd)) == summary.done == summary.completed_now
        assert rd.read_json("progress.json")["state"] == "interrupted"
        info = rd.read_json("run.json")
        assert info.pop("render") == "objects"  # a new run's; without it, a run of before
        rd.write_text_atomic("run.json", json.dumps(info))

        with caplog.at_level(logging.WARNING, logger="regen.engine.driver"):
            rest = run_job(
                m,
                RunDir.open(out, create=False),
                RunOptions(endpoints=[sim.url], address=ray_head.address, handle_signals=False),
            )
        said = [r for r in caplog.records if "keeps doing so" in r.getMessage()]
        assert len(said) == 1 and "as strings" in said[0].getMessage()
        assert rest.state == "finished" and rest.done == rest.total
        assert rest.completed_now == rest.total - summary.done
        learned = rd.read_json("schedule.json")["sources"]  # the order's estimate, saved
        regenerated = {s.name for s in m.sources if s.mode == "regenerate"}
        done_sources = read_done(rd).sources
        assert {k: v["turns"] for k, v in learned.items()} == {
            k: done_sources[k].rows for k in regenerated
        }
        assert sum(v["n"] for v in learned.values()) > 0, learned  # originals vs answers
