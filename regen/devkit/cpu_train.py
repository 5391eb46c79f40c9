"""``regen demo --train``: SpecForge 0.2.0's own trainer on this machine's CPU, on the demo run.

DEMO / CPU ONLY. The GPU launch path (:mod:`regen.train.launch`, :mod:`regen.train.preflight`,
``pipelines/train_draft.py``) never imports this module. It exists because SpecForge is built
for accelerators, and training a draft on a laptop needs these departures from a real launch,
each one the smallest that SpecForge 0.2.0 allows:

- ``SPECFORGE_DEVICE=cpu`` (its distributed layer then uses gloo) and
  ``TORCH_COMPILE_DISABLE=1``; ``training.fsdp_sharding: NO_SHARD`` (FSDP needs an
  accelerator, NO_SHARD is plain DDP) and ``attention_backend: sdpa``;
- the **offline** mode instead of the online one: online capture needs SGLang servers and
  Mooncake. The target's hidden states are captured here, in process, with transformers, in
  SpecForge's offline file layout (one ``.ckpt`` per row: ``input_ids``, ``loss_mask``,
  ``hidden_state`` = the last layer after the final norm ``[1, L, H]``, ``aux_hidden_state``
  = the outputs of the capture layers concatenated ``[1, L, 3H]``, as its
  ``scripts/prepare_hidden_states_hf.py`` writes them); the capture layers come from
  SpecForge's own resolver (``resolve_offline_capture``);
- ``specforge/core/loss.py`` imports triton for its fused loss kernel. The worker lets that
  import see a stand-in ``triton`` (the kernel is never called), then swaps the kernel for
  SpecForge's own reference ``_compute_loss`` (same arguments), as SpecForge's
  ``benchmark_loss.py`` does;
- SpecForge evaluates the held-out features only after an optimizer step; the worker adds one
  evaluation before the first, so the loss curve starts at the untrained draft (step 0).

Everything else is what a real launch uses: ``regen train``'s own preparation of the run
(:func:`regen.train.launch.prepare_training`: the export, the checks, ``draft_config.json``,
the vocab mapping, ``run.yaml`` and SpecForge's planner), then ``run.yaml`` with only the
changes above, trained by ``specforge.cli.main(["train", "--config", ...])``.

Files (names from :mod:`regen.store.layout`, under ``RUN_DIR/train/cpu/``)::

    features/rows_0/data_N.ckpt        SpecForge offline features of the training rows
    eval-features/rows_0/data_N.ckpt   ... of the held-out rows (every HOLDOUT_EVERY-th row)
    run.yaml                           regen's run.yaml with the CPU/offline changes
    train.log                          the trainer's output ("step N: {...}" per log line)
    curve.json                         CpuCurveRecord: training and held-out loss per step
    checkpoints/                       SpecForge's checkpoints (output_dir)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from regen.core.errors import ConfigError
from regen.manifest import read_yaml_file
from regen.store import RunDir
from regen.store import layout as L
from regen.train.data import open_local
from regen.train.launch import prepare_training

log = logging.getLogger(__name__)

#: every n-th exported row is held out of training and evaluated on
HOLDOUT_EVERY = 8
#: evaluate the held-out rows about every this many steps (and at step 0 and the last step)
EVAL_INTERVAL = 5
_STEP_LINE = re.compile(r"^step (\d+): (\{.*\})\s*$")


@dataclass(slots=True)
class CpuTrainResult:
    """What the CPU run did."""

    curve: L.CpuCurveRecord
    run_yaml: Path
    log_path: Path


def cpu_run_config(run: dict[str, Any], rd: RunDir, *, steps: int) -> dict[str, Any]:
    """regen's run.yaml with the CPU/offline changes of the module docstring only."""
    out = json.loads(json.dumps(run))
    data = out["data"]
    data.pop("prompts_path", None)
    data.update(
        hidden_states_path=rd.path(L.CPU_FEATURES),
        eval_hidden_states_path=rd.path(L.CPU_EVAL_FEATURES),
        cache_dir=rd.path(f"{L.CPU_TRAIN_DIR}/cache"),
        dataloader_num_workers=0,
    )
    out["training"].update(
        fsdp_sharding="NO_SHARD",
        attention_backend="sdpa",
        max_steps=steps,
        eval_interval=eval_interval(steps),
        save_interval=0,
    )
    trainer = out["deployment"]["trainer"]
    out["deployment"] = {"mode": "local_colocated", "trainer": trainer}
    out["output_dir"] = rd.path(L.CPU_CHECKPOINTS)
    return out


def eval_interval(steps: int) -> int:
    """The largest interval up to EVAL_INTERVAL that divides ``steps``: SpecForge evaluates
    when the step is a multiple of it, so the last step is always evaluated."""
    return next(d for d in range(min(EVAL_INTERVAL, steps), 0, -1) if steps % d == 0)


def capture_features(run_yaml: Path, prompts: Path, rd: RunDir) -> tuple[int, int]:
    """The target's hidden states of every prompts row, in SpecForge's offline layout; returns
    (training rows, held-out rows)."""
    import torch
    from specforge.application import resolve_offline_capture
    from specforge.config import load_config
    from transformers import AutoModelForCausalLM

    cfg = load_config(str(run_yaml))
    layers = resolve_offline_capture(cfg).capture_layers
    dtype = getattr(torch, cfg.model.torch_dtype)  # what the trainer reads; computed in fp32
    path = cfg.model.target_model_path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    counts = [0, 0]
    with prompts.open(encoding="utf-8") as f, torch.no_grad():
        for n, line in enumerate(f):
            row = json.loads(line)
            ids = torch.tensor(row["input_ids"][: cfg.data.max_length], dtype=torch.long)
            mask = torch.tensor(row["loss_mask"][: cfg.data.max_length], dtype=torch.long)
            states = model(input_ids=ids[None], output_hidden_states=True).hidden_states
            held = n % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
            where = L.CPU_EVAL_FEATURES if held else L.CPU_FEATURES
            i = counts[held]
            counts[held] += 1
            path = Path(rd.path(f"{where}/rows_0/data_{i:06d}.ckpt"))
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(
                {
                    "input_ids": ids,
                    "loss_mask": mask,
                    "hidden_state": states[-1].to(dtype).clone(),
                    "aux_hidden_state": torch.cat([states[k + 1] for k in layers], -1).to(dtype),
                },
                path,
            )
    return counts[0], counts[1]


def train_on_cpu(
    run_dir: str | Path, config_path: str | Path, *, steps: int, target_path: str
) -> CpuTrainResult:
    """Prepare the run as ``regen train --dry-run`` does, capture its features and train the
    draft with SpecForge on CPU for ``steps`` steps; the loss curve lands in curve.json."""

    raw = read_yaml_file(Path(config_path), "train config")
    if not isinstance(raw, dict) or not isinstance(raw.get("target"), dict):
        raise ConfigError(f"{config_path}: not a train config (no target section)")
    raw["target"]["path"] = target_path
    rd = open_local(run_dir)  # the one opening, passed on
    raw["output_dir"] = str(Path(rd.root).resolve() / L.CPU_CHECKPOINTS)
    with tempfile.TemporaryDirectory(prefix="regen-demo-train-") as tmp:
        cfg_path = Path(tmp) / "train.yaml"
        cfg_path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
        plan = prepare_training(rd, cfg_path)
    for sub in (L.CPU_FEATURES, L.CPU_EVAL_FEATURES, L.CPU_CHECKPOINTS):
        shutil.rmtree(rd.path(sub), ignore_errors=True)
    run = yaml.safe_load(plan.run_yaml.read_text(encoding="utf-8"))
    cpu_yaml = Path(rd.path(L.CPU_RUN_YAML))
    cpu_yaml.parent.mkdir(parents=True, exist_ok=True)
    cpu_yaml.write_text(yaml.safe_dump(cpu_run_config(run, rd, steps=steps), sort_keys=False))
    trained, held = capture_features(cpu_yaml, plan.prompts_path, rd)
    if not trained or not held:
        raise ConfigError(f"{plan.prompts_path} has too few rows to hold some out ({trained})")
    log.info("captured %d training and %d held-out rows; training %d steps", trained, held, steps)
    log_path = Path(rd.path(L.CPU_TRAIN_LOG))
    run_worker(cpu_yaml, log_path)
    curve = parse_curve(log_path.read_text(encoding="utf-8"), steps=steps)
    curve.checkpoint = _checkpoint(Path(rd.path(L.CPU_CHECKPOINTS)))
    L.CPU_CURVE_FILE.write(rd, curve)
    return CpuTrainResult(curve=curve, run_yaml=cpu_yaml, log_path=log_path)


def run_worker(run_yaml: Path, log_path: Path) -> None:
    """``python -m regen.devkit.cpu_train RUN_YAML``, its output into ``log_path``."""
    env = {**os.environ, "SPECFORGE_DEVICE": "cpu", "TORCH_COMPILE_DISABLE": "1"}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    cmd = [sys.executable, "-m", "regen.devkit.cpu_train", str(run_yaml)]
    with log_path.open("wb") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    if proc.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
        raise ConfigError(
            f"SpecForge's trainer exited with {proc.returncode} ({log_path}): "
            f"{tail[0] if tail else 'no output'}"
        )


def parse_curve(text: str, *, steps: int) -> L.CpuCurveRecord:
    """The training and held-out losses of SpecForge's "step N: {...}" log lines."""
    train: list[tuple[int, float]] = []
    held: list[tuple[int, float]] = []
    accept: list[tuple[int, float]] = []
    for line in text.splitlines():
        m = _STEP_LINE.match(line)
        if not m:
            continue
        step = int(m.group(1))
        metrics = json.loads(m.group(2).replace("'", '"'))
        if "eval/avg_loss" in metrics:
            held.append((step, round(float(metrics["eval/avg_loss"]), 6)))
            if "eval/acceptance_rate_0" in metrics:
                accept.append((step, round(float(metrics["eval/acceptance_rate_0"]), 6)))
        elif "loss" in metrics:
            train.append((step, round(float(metrics["loss"]), 6)))
    return L.CpuCurveRecord(
        steps=steps, train=train, held_out=held, held_out_acceptance=accept, checkpoint=None
    )


def _checkpoint(root: Path) -> str | None:
    """SpecForge's latest checkpoint directory under ``root`` (None when it wrote none)."""
    found = sorted((p for p in root.glob("*-step*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return str(found[-1]) if found else None


# ---- the worker process -------------------------------------------------------------------


def _install_cpu_shims() -> None:
    """The loss and evaluation shims of the module docstring (this process only)."""
    import torch

    torch.compile(dynamic=None)(lambda x: x)  # torch's own compile stack first, without triton
    stand_in = types.ModuleType("triton")
    language = types.ModuleType("triton.language")
    stand_in.jit = lambda fn=None, **_: fn if fn is not None else (lambda f: f)  # type: ignore[attr-defined]
    stand_in.language = language  # type: ignore[attr-defined]
    language.constexpr = object  # type: ignore[attr-defined]
    sys.modules.update({"triton": stand_in, "triton.language": language})
    try:
        import specforge.core.loss as loss
    finally:
        del sys.modules["triton"], sys.modules["triton.language"]

    class ReferenceLoss:
        @staticmethod
        def apply(logits: Any, target: Any, position_mask: Any) -> Any:
            return loss._compute_loss(logits, target, position_mask)

    import specforge.algorithms.eagle3.model as eagle3

    eagle3.LogSoftmaxLoss = ReferenceLoss  # type: ignore[assignment]

    from specforge.training.controller import TrainerController

    fit = TrainerController._fit

    def fit_after_step0_eval(self: Any, data: Any, progress: Any) -> int:
        if self.global_step == 0 and self.eval_interval and self.eval_data_factory is not None:
            metrics = self.evaluate_configured()
            self.core.strategy.trainable_module().train()
            if metrics and self.logger:
                self.logger(metrics, 0)
        return fit(self, data, progress)

    TrainerController._fit = fit_after_step0_eval  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:

    parser = argparse.ArgumentParser(prog="python -m regen.devkit.cpu_train")
    parser.add_argument("run_yaml", help=f"the CPU run config (RUN_DIR/{L.CPU_RUN_YAML})")
    args = parser.parse_args(argv)
    _install_cpu_shims()
    from specforge.cli import main as specforge_main

    return int(specforge_main(["train", "--config", args.run_yaml]) or 0)


if __name__ == "__main__":
    sys.exit(main())
