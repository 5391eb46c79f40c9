"""`ray job submit` of pipelines.regenerate on a real local Ray head, against the simulator."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from regen.devkit.simulate.testing import running_simulator
from regen.manifest import load_manifest
from regen.store import RunDir
from regen.store.doneset import read_done

pytestmark = [pytest.mark.ray, pytest.mark.ray_dashboard]

REPO = Path(__file__).resolve().parents[2]
#: bound on the whole job (submission, working-dir upload, run)
JOB_TIMEOUT_S = 240.0


def submit(client, entrypoint: str, deadline: float) -> str:
    """Submit a job (a fresh head's job agent may not be up yet: "No available agent")."""
    while True:
        try:
            return client.submit_job(
                entrypoint=entrypoint,
                runtime_env={"working_dir": str(REPO), "env_vars": {"RAY_AUTH_MODE": "disabled"}},
            )
        except RuntimeError as e:
            if "agent" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def finish(client, job: str, deadline: float) -> tuple[Any, str]:
    """The job's terminal status and its logs (stopped when the deadline passes first)."""
    status = client.get_job_status(job)
    while not status.is_terminal() and time.monotonic() < deadline:
        time.sleep(1.0)
        status = client.get_job_status(job)
    logs = client.get_job_logs(job)
    if not status.is_terminal():
        client.stop_job(job)
    return status, logs


def test_ray_job_submit_finishes_the_demo(ray_head, tmp_path) -> None:
    from ray.job_submission import JobStatus, JobSubmissionClient

    out = tmp_path / "run"
    with running_simulator(model_name="demo-target", instant=True, mean_tokens=24) as sim:
        client = JobSubmissionClient(ray_head.dashboard_url)
        deadline = time.monotonic() + JOB_TIMEOUT_S
        job = submit(client, "python -m pipelines.regenerate manifests/demo.yaml "
                     f"--out {out} --endpoint {sim.url} --workers 1 --concurrency 4 --no-view",
                     deadline)  # fmt: skip
        status, logs = finish(client, job, deadline)
        assert status == JobStatus.SUCCEEDED, logs[-4000:]
        received = sim.stats()["received"]

    rd = RunDir.open(out)
    done = read_done(rd)
    progress = rd.read_json("progress.json")
    assert progress["state"] == "finished"
    assert len(done) == sum(s["total"] for s in progress["sources"].values()) > 60
    assert set(done.sources) == {
        s.name for s in load_manifest(REPO / "manifests/demo.yaml").sources
    }
    parts = [p for p in rd.list("parts") if p.endswith(".parquet")]  # not the _*.json records
    rows = [r for p in parts for r in pq.read_table(out / "parts" / p).to_pylist()]
    regenerated = [r for r in rows if r["token_source"] != "native"]
    assert len(regenerated) == received  # one request per stored turn, nothing lost or repeated
    assert all(r["endpoint"] == sim.url for r in regenerated)
    assert "finished" in logs


def test_a_job_that_leaves_samples_for_the_next_run_reads_failed(ray_head, tmp_path) -> None:
    """Exit 75 (samples left: here every request is refused by a gateway) is a FAILED job, so
    orchestration sees it; submitting the same job again continues."""
    from _gateway import Gateway
    from ray.job_submission import JobStatus, JobSubmissionClient

    from regen.client.endpoints import server_root

    out = tmp_path / "run"
    with (
        running_simulator(model_name="demo-target", instant=True, mean_tokens=24) as sim,
        Gateway(server_root(sim.url)).running() as gw,
    ):
        gw.refuse_after = 0
        client = JobSubmissionClient(ray_head.dashboard_url)
        deadline = time.monotonic() + JOB_TIMEOUT_S
        job = submit(client, "python -m pipelines.regenerate manifests/demo.yaml "
                     f"--out {out} --endpoint {gw.url} --workers 1 --concurrency 2 --no-view",
                     deadline)  # fmt: skip
        status, logs = finish(client, job, deadline)
    assert status == JobStatus.FAILED, logs[-4000:]
    assert "exit code 75" in " ".join((client.get_job_info(job).message or "").split())
    assert "no endpoint left" in " ".join(logs.split())
    stored = read_done(RunDir.open(out)).ids  # only native rows, which need no request
    assert all(sid.startswith("kimi_native:") for sid in stored), sorted(stored)[:5]
