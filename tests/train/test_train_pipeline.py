"""pipelines/train_draft.py, the `ray job submit` entrypoint, run as a real subprocess."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from train_fixtures import REPO, kimi_config

#: bound on one entrypoint run (imports, export scan, SpecForge config validation)
RUN_TIMEOUT_S = 120


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.train_draft", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def test_dry_run_writes_the_config_and_logs_the_exact_trainer_argv(
    run_dir: Path, write_train_yaml
) -> None:
    proc = _run(str(run_dir), "--config", str(write_train_yaml()), "--dry-run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_yaml = run_dir / "train" / "run.yaml"
    argv = ["specforge", "train", "--config", str(run_yaml)]
    assert f"trainer argv:   {shlex.join(argv)}" in proc.stdout  # printed, not run
    command = json.loads((run_dir / "train" / "command.json").read_text())
    assert command["argv"] == argv
    assert "-m regen.train.preflight --run-dir" in command["entrypoint"]
    assert "strategy: eagle3" in run_yaml.read_text()
    assert not (run_dir / "train" / "job.json").exists()  # nothing was submitted


def test_a_trap_exits_2_with_one_error_line(run_dir: Path, write_train_yaml) -> None:
    cfg = write_train_yaml(kimi_config(serving={"speculative_algorithm": "EAGLE"}))
    proc = _run(str(run_dir), "--config", str(cfg), "--dry-run")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "[eagle-vs-eagle3]" in errors[0]
    assert "Traceback" not in proc.stderr
