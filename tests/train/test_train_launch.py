"""prepare/dry-run path: export found, run.yaml written and validated, exact command recorded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from train_fixtures import REPO, good_rows, kimi_config, kimi_row, write_export

from regen.cli.main import main as regen_main
from regen.core.errors import TrapError
from regen.store import layout
from regen.store.rundir import RunDir
from regen.train import data
from regen.train.launch import LaunchOptions, launch_training, prepare_training
from regen.train.preflight import count_prepared, preflight


def test_dry_run_writes_validated_config_and_exact_command(run_dir: Path, write_train_yaml):
    result = launch_training(
        data.open_local(run_dir), write_train_yaml(), LaunchOptions(dry_run=True, launcher="echo")
    )
    plan = result.plan
    run_yaml = run_dir / "train" / "run.yaml"
    assert result.submission_id is None and not (run_dir / "train" / "job.json").exists()
    assert plan.argv == ["specforge", "train", "--config", str(run_yaml)]
    assert plan.exec_argv == ["echo", *plan.argv]
    assert plan.gpus == 1  # demo: nproc_per_node 1
    assert plan.specforge_plan is not None
    # two shards are concatenated into one prompts file (SpecForge takes one path)
    assert plan.prompts_path == run_dir / "train" / "prompts.jsonl"
    assert plan.scan.rows == 6
    command = json.loads((run_dir / "train" / "command.json").read_text())
    assert command["argv"] == plan.argv and command["gpus"] == 1
    assert "-m regen.train.preflight --run-dir" in command["entrypoint"]


def test_cli_dry_run_prints_config_and_command(run_dir: Path, write_train_yaml, capsys):
    rc = regen_main(["train", str(run_dir), "--config", str(write_train_yaml()), "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"specforge train --config {run_dir}/train/run.yaml" in out
    assert "strategy: eagle3" in out and "GPUs requested: 1" in out


def test_cli_trap_is_one_clean_line_and_exit_2(run_dir: Path, write_train_yaml, capsys):
    cfg = write_train_yaml(kimi_config(serving={"speculative_algorithm": "EAGLE"}))
    rc = regen_main(["train", str(run_dir), "--config", str(cfg), "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2 and "[eagle-vs-eagle3]" in err
    assert not (run_dir / "train" / "run.yaml").exists()


def test_bad_export_is_refused_before_submitting(tmp_path: Path, write_train_yaml):
    rd = tmp_path / "bad"
    covers = kimi_row([1], [2])
    covers["loss_mask"] = [1] * len(covers["input_ids"])
    write_export(rd, [*good_rows(3), covers], shards=1)
    with pytest.raises(TrapError) as ei:
        prepare_training(data.open_local(rd), write_train_yaml())
    assert ei.value.trap == "loss-mask-covers-prompt"


def test_preflight_runs_specforge_prompt_builder(run_dir: Path, write_train_yaml):
    prepare_training(
        data.open_local(run_dir),
        write_train_yaml(),
        LaunchOptions(launcher="echo", python=sys.executable),
    )
    record = preflight(str(run_dir))
    assert record.ok and record.rows == 6 and record.prepared == 6
    assert record.exec_argv[0] == "echo"
    prompts = str(run_dir / "train" / "prompts.jsonl")
    assert count_prepared(prompts, max_length=4096, chunk_rows=4) == 6  # two chunks
    # rows whose answer lies past max_length are dropped by SpecForge, not by us
    assert count_prepared(prompts, max_length=8) == 0


def test_preflight_refuses_a_config_changed_after_launch(run_dir: Path, write_train_yaml):
    prepare_training(data.open_local(run_dir), write_train_yaml())
    (run_dir / layout.TRAIN_YAML).write_text(
        (run_dir / layout.TRAIN_YAML).read_text().replace("EAGLE3", "EAGLE")
    )
    with pytest.raises(TrapError) as ei:
        preflight(str(run_dir))
    assert ei.value.trap == "eagle-vs-eagle3"


def _write_parts(run_dir: Path, rows: list[dict], first_id: int = 0) -> None:
    import pyarrow.parquet as pq

    from regen.core.sample import Sample
    from regen.engine.rows import native_row
    from regen.store.schema import rows_to_table

    table = rows_to_table(
        [
            native_row(
                Sample(id=f"native:{i}", source="native", messages=[], **r)  # ids + mask
            )
            for i, r in enumerate(rows, start=first_id)
        ]
    )
    (run_dir / "parts").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, run_dir / "parts" / f"p-{len(rows)}.parquet")


def test_run_without_export_is_exported_then_reexported_when_stale(
    tmp_path: Path, write_train_yaml
) -> None:
    rd = tmp_path / "fresh"
    _write_parts(rd, good_rows(4))
    cfg = write_train_yaml(kimi_config(export={"shard_rows": 0}))
    plan = prepare_training(data.open_local(rd), cfg)
    assert plan.prompts_path == rd / "export" / "shard-00000.jsonl"  # one shard: used directly
    assert plan.scan.rows == 4
    rows = [json.loads(line) for line in plan.prompts_path.read_text().splitlines()]
    assert sorted(r["input_ids"] for r in rows) == sorted(r["input_ids"] for r in good_rows(4))
    # a part newer than the export's stats.json makes the export stale: it is redone
    import os
    import time

    stats = rd / "export" / "stats.json"
    past = time.time() - 60
    os.utime(stats, (past, past))
    _write_parts(rd, good_rows(6)[4:], first_id=4)
    assert prepare_training(data.open_local(rd), cfg).scan.rows == 6


def test_the_run_manifest_is_read_once_and_its_export_section_is_followed(
    tmp_path: Path, write_train_yaml, monkeypatch
) -> None:
    """`regen train` reads manifest.yaml once: the run's tokenizer and the export's settings
    both come from that one reading."""
    rd = tmp_path / "fresh"
    _write_parts(rd, good_rows(4))
    manifest = yaml.safe_load((REPO / "manifests" / "demo.yaml").read_text())
    manifest["export"] = {"keep_unproven": True}
    (rd / layout.MANIFEST).write_text(yaml.safe_dump(manifest))
    reads: list[str] = []
    read_text = RunDir.read_text

    def counted(self: RunDir, rel: str) -> str | None:
        reads.append(rel)
        return read_text(self, rel)

    monkeypatch.setattr(RunDir, "read_text", counted)
    prepare_training(data.open_local(rd), write_train_yaml())
    assert reads.count(layout.MANIFEST) == 1
    stats = json.loads((rd / "export" / "stats.json").read_text())
    assert stats["keep_unproven"] is True


def test_preflight_refuses_a_capture_server_running_eagle(
    tmp_path: Path, run_dir: Path, write_train_yaml
):
    from regen.devkit.simulate.testing import simulator_in_thread

    with simulator_in_thread(
        instant=True, speculative_algorithm="EAGLE", speculative_draft_model_path="/d"
    ) as sim:
        cfg = write_train_yaml(kimi_config(capture={"server_urls": [sim.base]}))
        prepare_training(data.open_local(run_dir), cfg)
        with pytest.raises(TrapError) as ei:
            preflight(str(run_dir))
    assert ei.value.trap == "eagle-vs-eagle3" and sim.base in str(ei.value)


class _FlakyJobClient:
    """A job client that refuses the first submissions (agent still starting)."""

    def __init__(self, refusals: int, lands: bool = False) -> None:
        self.refusals, self.lands, self.calls, self.jobs = refusals, lands, 0, set()

    def submit_job(self, *, submission_id: str, **kw) -> str:
        self.calls += 1
        if self.calls <= self.refusals:
            if self.lands:
                self.jobs.add(submission_id)
            raise RuntimeError("Request failed with status code 500: No available agent")
        self.jobs.add(submission_id)
        self.kw = kw
        return submission_id

    def get_job_info(self, submission_id: str) -> object:
        if submission_id not in self.jobs:
            raise RuntimeError("not found")
        return object()


@pytest.mark.parametrize(("refusals", "lands", "calls"), [(2, False, 3), (1, True, 1)])
def test_submission_retries_a_refusal_without_sleeping(
    monkeypatch, run_dir: Path, write_train_yaml, refusals: int, lands: bool, calls: int
):
    from regen.train import launch

    fake = _FlakyJobClient(refusals, lands)
    monkeypatch.setattr(launch, "_client", lambda address: fake)
    slept: list[float] = []
    plan = prepare_training(data.open_local(run_dir), write_train_yaml(), LaunchOptions(gpus=8))
    sid = launch.submit_training(plan, sleep=slept.append)
    assert fake.calls == calls and sid in fake.jobs
    assert slept == [0.5, 1.0][: calls - 1]
    job = json.loads((run_dir / layout.JOB).read_text())
    assert job["submission_id"] == sid and job["entrypoint_num_gpus"] == 8
    assert job["state"] == "PENDING"


def test_submission_gives_up_with_a_config_error(monkeypatch, run_dir: Path, write_train_yaml):
    from regen.core.errors import ConfigError
    from regen.train import launch

    fake = _FlakyJobClient(refusals=99)
    monkeypatch.setattr(launch, "_client", lambda address: fake)
    plan = prepare_training(data.open_local(run_dir), write_train_yaml())
    with pytest.raises(ConfigError, match="after 3 attempts"):
        launch.submit_training(plan, attempts=3, sleep=lambda s: None)
    assert fake.calls == 3 and not (run_dir / layout.JOB).exists()


class _StatusClient:
    """Answers get_job_status from a script; an Exception entry is raised."""

    def __init__(self, script: list) -> None:
        self.script = script

    def get_job_status(self, submission_id: str):
        from ray.job_submission import JobStatus

        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        return JobStatus(item)

    def get_job_info(self, submission_id: str):
        class Info:
            message = "Job finished successfully."

        return Info()


def test_follow_records_each_state_change_once_and_survives_a_glitch(monkeypatch, run_dir: Path):
    from regen.train import launch

    script = ["PENDING", "RUNNING", ConnectionError("reset"), "RUNNING", "SUCCEEDED"]
    monkeypatch.setattr(launch, "_client", lambda address: _StatusClient(script))
    (run_dir / "train").mkdir()
    (run_dir / layout.JOB).write_text(json.dumps({"state": "PENDING", "history": []}))
    slept: list[float] = []
    state, message, seen = launch.follow_job(
        data.open_local(run_dir), "sid", poll_s=7, sleep=slept.append
    )
    assert (state, seen) == ("SUCCEEDED", ["PENDING", "RUNNING", "SUCCEEDED"])
    assert message == "Job finished successfully." and slept == [7, 7, 7, 7]
    job = json.loads((run_dir / layout.JOB).read_text())
    assert [h["state"] for h in job["history"]] == ["RUNNING", "SUCCEEDED"]
    assert job["state"] == "SUCCEEDED"
