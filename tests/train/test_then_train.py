"""`regen run ... --then-train train.yaml`: the training job is submitted once the run finished."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from train_fixtures import REPO, demo_train_config

from regen.devkit.simulate.testing import running_simulator

DEMO = REPO / "manifests" / "demo.yaml"


@pytest.mark.ray
@pytest.mark.ray_dashboard
def test_then_train_submits_the_gpu_job_after_the_run(tmp_path: Path, ray_head, ray_env) -> None:
    cfg = tmp_path / "train.yaml"
    # the demo target's shape (a stand-in path: only the run's tokenizer is compared here);
    # the simulator's answers are flagged often: this test is about the submission
    target = tmp_path / "demo-target"
    cfg.write_text(yaml.safe_dump(demo_train_config(target, export={"max_drop_share": 1.0})))
    out = tmp_path / "run"
    env = {**ray_env, "REGEN_TRAIN_LAUNCHER": "echo LAUNCH", "REGEN_TRAIN_PYTHON": sys.executable}
    tokenizer = str(REPO / "manifests" / "demo" / "tokenizer")
    with running_simulator(
        model_name="demo-target", instant=True, mean_tokens=24, tokenizer=tokenizer
    ) as sim:
        cmd = [sys.executable, "-m", "regen", "run", str(DEMO), "--out", str(out),
               "--endpoint", sim.url, "--address", ray_head.address, "--workers", "1",
               "--limit", "12", "--no-view", "--then-train", str(cfg),
               "--train-address", ray_head.dashboard_url]  # fmt: skip
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=240, check=False)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    job = json.loads((out / "train" / "job.json").read_text())
    assert job["submission_id"] in proc.stdout
    assert job["entrypoint_num_gpus"] >= 1
    assert job["state"] in ("PENDING", "RUNNING", "SUCCEEDED")
    command = json.loads((out / "train" / "command.json").read_text())
    assert command["argv"] == ["specforge", "train", "--config", str(out / "train" / "run.yaml")]
    # the export the job trains on was made from this run's rows
    stats = json.loads(next((out).rglob("stats.json")).read_text())
    assert stats["rows_written"] > 0
