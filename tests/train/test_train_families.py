"""`regen train` for a target that is not Kimi: a real Qwen3-format run, SpecForge's own code.

One run of ``manifests/demo-qwen3.yaml`` against ``transformers serve`` of the Qwen3 demo
target (regen.devkit.demo_target, built once per checkout under ``.cache/demo-model-qwen3``),
as ``regen demo --target qwen3`` runs it. On it:

- ``regen export`` and SpecForge 0.2.0's ``prepare_prompt_tasks`` accept every row, ids and
  masks unchanged;
- ``regen train --dry-run`` passes with the Qwen3 demo train config (its checks, the run held
  against the target with Qwen3's special tokens, SpecForge's planner) and refuses the Qwen3
  production config, naming the vocabulary that does not fit;
- SpecForge's own training loop trains a draft on the Qwen3 export on this CPU, and the
  held-out loss falls below 0.95 of the untrained draft's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from train_fixtures import REPO, served_run

from regen.cli.main import main as regen_main
from regen.store import layout as L

pytestmark = [pytest.mark.ray, pytest.mark.server, pytest.mark.timeout(900)]

MANIFEST = REPO / "manifests" / "demo-qwen3.yaml"
TRAIN = REPO / "manifests" / "demo-train-qwen3.yaml"
PRODUCTION = REPO / "manifests" / "train-qwen3-235b-eagle3.yaml"
CPU_STEPS = 30
RUN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def qwen3_target() -> Path:
    from regen.devkit.servers import build_demo_target

    return build_demo_target(REPO / ".cache" / "demo-model-qwen3", MANIFEST)


@pytest.fixture(scope="module")
def qwen3_run(tmp_path_factory, qwen3_target: Path, ray_head, ray_env) -> Path:
    tmp = tmp_path_factory.mktemp("qwen3-run")
    return served_run(MANIFEST, qwen3_target, tmp, ray_head.address, ray_env, RUN_TIMEOUT_S)


@pytest.fixture
def run_copy(qwen3_run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(qwen3_run, dst)
    return dst


def test_the_run_is_qwen3_and_specforge_accepts_every_exported_row(
    qwen3_run: Path, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    from regen.train.preflight import prompt_tasks

    rows = [r for p in sorted((qwen3_run / "parts").glob("*.parquet"))
            for r in pq.read_table(p).to_pylist()]  # fmt: skip
    assert rows and {r["family"] for r in rows} == {"qwen3"}
    texts = [r["text"] for r in rows if r["text"]]
    assert all("<|im_start|>assistant\n" in t for t in texts)
    out = tmp_path / "export"
    argv = ["export", str(qwen3_run), "--out", str(out), "--shard-rows", "0",
            "--drop-flags", "none", "--keep-truncated", "--keep-unproven"]  # fmt: skip
    assert regen_main(argv) == 0
    lines = (out / "shard-00000.jsonl").read_text().splitlines()
    assert len(lines) == len(rows)
    tasks = prompt_tasks(out / "shard-00000.jsonl", max_length=1_000_000)
    assert len(tasks) == len(lines)  # 100 % accepted
    assert [t["payload"] for t in tasks] == [json.loads(line) for line in lines]


def test_train_dry_run_holds_the_qwen3_run_against_its_targets(run_copy: Path, capsys) -> None:
    assert regen_main(["train", str(run_copy), "--config", str(TRAIN), "--dry-run"]) == 0
    run_yaml = (run_copy / L.RUN_YAML).read_text()
    assert ".cache/demo-model-qwen3" in run_yaml
    capsys.readouterr()
    (run_copy / L.RUN_YAML).unlink()
    argv = ["train", str(run_copy), "--config", str(PRODUCTION), "--dry-run"]
    assert regen_main(argv) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "[run-vs-target-tokenizer] tokenizer vocab size" in errors[0]
    assert "1,024 tokens" in errors[0] and "151,669 (target.tokenizer_size)" in errors[0]


def test_specforge_trains_a_draft_on_the_qwen3_export_and_the_held_out_loss_falls(
    run_copy: Path, qwen3_target: Path
) -> None:
    from regen.devkit.cpu_train import train_on_cpu

    result = train_on_cpu(run_copy, TRAIN, steps=CPU_STEPS, target_path=str(qwen3_target))
    (s0, first), (s_end, last) = result.curve.held_out[0], result.curve.held_out[-1]
    ratio = last / first
    print(f"\nqwen3 held-out loss: step {s0} {first:.4f}, step {s_end} {last:.4f} ({ratio:.3f}x)")
    assert (s0, s_end) == (0, CPU_STEPS)
    assert last < 0.95 * first, result.curve.held_out
