"""The loop's drafts: SpecForge's own exporter on a training checkpoint, and a never-trained
draft of the same config to compare against.

Both go through the same path: a SpecForge training state (the trainer's checkpoint, or
:func:`untrained_state`'s) → ``python -m specforge.export.to_sglang`` (SpecForge's exporter,
the draft directory SGLang serves as is) with the run's ``train/draft_config.json`` and
vocabulary mapping → ``regen serve-command DRAFT --engine vllm`` (the copy vLLM serves,
:mod:`regen.serve.vllm`). Writes only the folders it is given.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from regen.core.errors import ConfigError
from regen.serve.vllm import CONFIG
from regen.store import layout as L

log = logging.getLogger(__name__)

#: the seed of the never-trained draft's initial weights
UNTRAINED_SEED = 0


def export_argv(checkpoint: str | Path, run_dir: Path, out: Path) -> list[str]:
    """SpecForge's exporter on ``checkpoint`` with the run's draft config and vocab mapping."""
    return [
        sys.executable, "-m", "specforge.export.to_sglang", "--checkpoint", str(checkpoint),
        "--draft-config", str(run_dir / L.DRAFT_CONFIG), "--output-dir", str(out),
        "--vocab-mapping", str(run_dir / L.VOCAB_MAPPING),
    ]  # fmt: skip


def export_draft(argv: list[str], out: Path, log_path: Path) -> Path:
    """Run the exporter (``argv`` from :func:`export_argv`), its output into ``log_path``;
    returns the draft directory ``out``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPECFORGE_DEVICE": "cpu", "TORCH_COMPILE_DISABLE": "1"}
    with log_path.open("wb") as f:
        proc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, check=False)
    if proc.returncode != 0 or not (out / CONFIG).is_file():
        tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
        raise ConfigError(
            f"SpecForge's exporter exited with {proc.returncode} ({log_path}): "
            f"{tail[0] if tail else 'no output'}"
        )
    return out


def untrained_state(run_dir: Path, out: Path) -> Path:
    """SpecForge's EAGLE-3 draft of the run's ``train/draft_config.json`` at its initial
    weights (seed :data:`UNTRAINED_SEED`), saved as a training state SpecForge's exporter
    reads (``strategy``, ``draft_state_dict``)."""
    import torch
    from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig

    config = AutoDraftModelConfig.from_file(str(run_dir / L.DRAFT_CONFIG))
    torch.manual_seed(UNTRAINED_SEED)
    model = AutoDraftModel.from_config(config, torch_dtype=torch.bfloat16)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"strategy": "eagle3", "draft_state_dict": model.state_dict()}, out)
    log.info("never-trained %s written to %s", type(model).__name__, out)
    return out
