"""A worker actor killed mid-run: its samples go back to the queue, a replacement starts, and
the session finishes with every sample stored once; with no respawn budget and no survivor,
the session ends with one clear error and the directory resumes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from regen.core.errors import RegenError
from regen.devkit.simulate.testing import simulator_in_thread
from regen.engine import RunOptions, run_job
from regen.manifest import load_manifest
from regen.store import RunDir
from regen.store.doneset import read_done
from regen.store.layout import LOCK as LOCK_FILE

pytestmark = pytest.mark.ray

DEMO = Path(__file__).resolve().parents[2] / "manifests" / "demo.yaml"
#: seconds the killer waits for the first completed sample
KILL_DEADLINE_S = 90.0


def journal_size(rd: RunDir) -> int:
    return sum(rd.size(f"journal/{n}") for n in rd.list("journal") if n.endswith(".jsonl"))


def killer(rd: RunDir, suffix: str, done: threading.Event, killed: list[str]) -> None:
    """Once the workers exist and one more sample is journaled, kill the actor whose name
    ends in ``suffix`` (once)."""
    import ray

    deadline = time.monotonic() + KILL_DEADLINE_S
    names: list[str] = []
    size = -1
    while time.monotonic() < deadline and not done.is_set():
        time.sleep(0.05)
        if not ray.is_initialized():
            continue
        if not names:
            names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                     if a["name"].startswith("regen-") and a["name"].endswith(suffix)]  # fmt: skip
            size = journal_size(rd)
            continue
        if journal_size(rd) > size:
            ray.kill(ray.get_actor(names[0]), no_restart=True)
            killed.append(names[0])
            return


def stored_ids(rd: RunDir) -> list[str]:
    ids: list[str] = []
    for name in rd.list("parts"):
        if name.endswith(".parquet"):
            t = pq.read_table(rd.path(f"parts/{name}"), columns=["sample_id", "turn"],
                              filesystem=rd.fs)  # fmt: skip
            ids += [f"{s}#{t}" for s, t in zip(t["sample_id"].to_pylist(),
                                               t["turn"].to_pylist(), strict=True)]  # fmt: skip
    return ids


def run_with_kill(m, out: Path, url: str, address: str, **opts):
    rd = RunDir.open(out)
    done, killed = threading.Event(), []
    t = threading.Thread(target=killer, args=(rd, "-w0-0", done, killed), daemon=True)
    t.start()
    try:
        return run_job(
            m,
            RunDir.open(out, create=False),
            RunOptions(endpoints=[url], address=address, handle_signals=False, **opts),
        ), killed
    finally:
        done.set()
        t.join(timeout=5)


def test_dead_worker_requeued_and_replaced(ray_head, tmp_path) -> None:
    m = load_manifest(DEMO, ["engine.concurrency=2"])
    out = tmp_path / "run"
    with simulator_in_thread(model_name="demo-target", max_running_requests=4, step_ms=4,
                             mean_tokens=40) as sim:  # fmt: skip
        summary, killed = run_with_kill(m, out, sim.url, ray_head.address, workers=2)
    assert killed, "the killer never saw a completed sample"
    assert summary.state == "finished"
    assert summary.workers_died == 1 and summary.workers_respawned == 1
    assert summary.done == summary.total - summary.failed_permanent
    rd = RunDir.open(out)
    ids = stored_ids(rd)
    assert len(ids) == len(set(ids))  # no (sample, turn) twice
    assert len(read_done(rd)) == summary.done
    progress = rd.read_json("progress.json")
    assert progress["errors"]["worker_died"]["count"] == 1


def test_no_survivor_and_no_budget_is_one_clear_error(ray_head, tmp_path) -> None:
    m = load_manifest(DEMO, ["engine.concurrency=2"])
    out = tmp_path / "run"
    with simulator_in_thread(model_name="demo-target", max_running_requests=4, step_ms=4,
                             mean_tokens=40) as sim:  # fmt: skip
        with pytest.raises(RegenError, match="all workers died"):
            run_with_kill(m, out, sim.url, ray_head.address, workers=1, max_respawns=0)
        rd = RunDir.open(out)
        assert not rd.exists(LOCK_FILE)
        before = len(read_done(rd))
        rest = run_job(
            m,
            RunDir.open(out, create=False),
            RunOptions(endpoints=[sim.url], address=ray_head.address, handle_signals=False),
        )
    assert rest.state == "finished" and rest.done == rest.total - rest.failed_permanent
    assert rest.completed_now == rest.done - before
