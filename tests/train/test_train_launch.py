"""prepare/dry-run path: export found, run.yaml written and validated, exact command recorded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import demo_config, good_rows, kimi_row, write_export

from regen.cli.main import main as regen_main
from regen.errors import TrapError
from regen.train import layout
from regen.train.launch import launch_training, prepare_training
from regen.train.preflight import count_prepared, preflight


def test_dry_run_writes_validated_config_and_exact_command(run_dir: Path, write_train_yaml):
    result = launch_training(run_dir, write_train_yaml(), dry_run=True, launcher="echo")
    plan = result.plan
    run_yaml = run_dir / "train" / "run.yaml"
    assert result.submission_id is None and not (run_dir / "train" / "job.json").exists()
    assert plan.argv == ["specforge", "train", "--config", str(run_yaml)]
    assert plan.exec_argv == ["echo", *plan.argv]
    assert plan.gpus == 1  # demo: nproc_per_node 1
    assert plan.specforge_validated
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
    cfg = write_train_yaml(demo_config(serving={"speculative_algorithm": "EAGLE"}))
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
        prepare_training(rd, write_train_yaml())
    assert ei.value.trap == "loss-mask-covers-prompt"


def test_preflight_runs_specforge_prompt_builder(run_dir: Path, write_train_yaml):
    prepare_training(run_dir, write_train_yaml(), launcher="echo", python=sys.executable)
    record = preflight(str(run_dir))
    assert record["ok"] and record["rows"] == 6 and record["prepared"] == 6
    assert record["exec_argv"][0] == "echo"
    prompts = str(run_dir / "train" / "prompts.jsonl")
    assert count_prepared(prompts, max_length=4096, chunk_rows=4) == 6  # two chunks
    # rows whose answer lies past max_length are dropped by SpecForge, not by us
    assert count_prepared(prompts, max_length=8) == 0


def test_preflight_refuses_a_config_changed_after_launch(run_dir: Path, write_train_yaml):
    prepare_training(run_dir, write_train_yaml())
    (run_dir / layout.TRAIN_YAML).write_text(
        (run_dir / layout.TRAIN_YAML).read_text().replace("EAGLE3", "EAGLE")
    )
    with pytest.raises(TrapError) as ei:
        preflight(str(run_dir))
    assert ei.value.trap == "eagle-vs-eagle3"


def _write_parts(run_dir: Path, rows: list[dict], first_id: int = 0) -> None:
    import pyarrow.parquet as pq

    from regen.rows import native_row, rows_to_table
    from regen.sample import Sample

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
    cfg = write_train_yaml(demo_config(export={"shard_rows": 0}))
    plan = prepare_training(rd, cfg)
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
    assert prepare_training(rd, cfg).scan.rows == 6
