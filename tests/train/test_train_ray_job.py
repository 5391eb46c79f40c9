"""On a real local Ray head with 8 logical GPUs: submit, preflight on the cluster, exact argv."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from train_fixtures import kimi_row

from regen.store import layout
from regen.train import data
from regen.train.launch import (
    LaunchOptions,
    follow_job,
    launch_training,
    prepare_training,
    submit_training,
)

pytestmark = [pytest.mark.ray, pytest.mark.ray_dashboard, pytest.mark.timeout(240)]


def _logs(address: str, submission_id: str) -> str:
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address).get_job_logs(submission_id)


def test_job_runs_preflight_on_cluster_then_the_exact_specforge_argv(
    ray_head, run_dir: Path, write_train_yaml
) -> None:
    address = ray_head.dashboard_url
    states: list[str] = []
    result = launch_training(
        data.open_local(run_dir),
        write_train_yaml(),
        LaunchOptions(
            address=address,
            gpus=8,
            launcher="echo LAUNCH",
            python=sys.executable,
            poll_s=0.5,
            timeout_s=180,
            on_state=states.append,
        ),
    )
    run_yaml = str(run_dir / "train" / "run.yaml")
    expected = ["specforge", "train", "--config", run_yaml]
    assert result.state == "SUCCEEDED", _logs(address, result.submission_id)
    assert states[-1] == "SUCCEEDED"

    job = json.loads((run_dir / layout.JOB).read_text())
    assert job["submission_id"] == result.submission_id
    assert job["state"] == "SUCCEEDED" and job["entrypoint_num_gpus"] == 8
    assert [h["state"] for h in job["history"]][-1] == "SUCCEEDED"

    pre = json.loads((run_dir / layout.PREFLIGHT).read_text())
    assert pre["ok"] and pre["rows"] == 6 and pre["prepared"] == 6
    assert pre["argv"] == expected and pre["exec_argv"] == ["echo", "LAUNCH", *expected]
    # Ray granted the 8 GPUs the job asked for
    assert len(pre["cuda_visible_devices"].split(",")) == 8
    # SpecForge's own planner ran again in the job, where the trainer starts
    plan = json.loads((run_dir / layout.SPECFORGE_PLAN).read_text())
    assert plan["where"] == "cluster" and pre["specforge_plan"] == {
        "kind": "supervisor",
        "role": "both",
    }

    assert f"LAUNCH specforge train --config {run_yaml}" in _logs(address, result.submission_id)


def test_cluster_preflight_refuses_data_changed_after_submit(
    ray_head, run_dir: Path, write_train_yaml
) -> None:
    address = ray_head.dashboard_url
    plan = prepare_training(
        data.open_local(run_dir),
        write_train_yaml(),
        LaunchOptions(gpus=8, launcher="echo LAUNCH", python=sys.executable),
    )
    bad = kimi_row([1], [2])
    bad["loss_mask"] = [0] * len(bad["input_ids"])
    with plan.prompts_path.open("a") as f:
        f.write(json.dumps(bad) + "\n")
    sid = submit_training(plan, address=address)
    state, _, _ = follow_job(
        data.open_local(run_dir), sid, address=address, poll_s=0.5, timeout_s=180
    )
    assert state == "FAILED"
    pre = json.loads((run_dir / layout.PREFLIGHT).read_text())
    assert pre["ok"] is False and pre["trap"] == "empty-loss-mask"
    assert json.loads((run_dir / layout.JOB).read_text())["state"] == "FAILED"
    assert "LAUNCH specforge" not in _logs(address, sid)
