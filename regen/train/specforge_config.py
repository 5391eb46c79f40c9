"""Writes the SpecForge run config (``specforge train --config run.yaml``) and draft config.

Files owned (under ``RUN_DIR/train/``)::

    draft_config.json   the EAGLE-3 draft (LlamaForCausalLMEagle3): hidden, 1 layer, vocab,
                        draft vocab, target hidden, eagle_config.eagle_aux_hidden_state_layer_ids
                        (SpecForge numbering)
    run.yaml            SpecForge 0.2.0 run config: run_id, output_dir, model (with
                        vocab_mapping_path, regen.train.vocab), data (prompts_path), training
                        (strategy eagle3), deployment (disaggregated)
    specforge_plan.json SpecForge's own launch plan of run.yaml (SpecForgePlanRecord)

The run config is checked by :mod:`regen.train.checks` and, where SpecForge is importable, by
SpecForge itself the way ``specforge train --config run.yaml --plan`` does: ``load_config``
(its strict schema), ``resolve_run`` (the algorithm's checks of the config: feature mode,
draft, attention backend, aux layers, topology, vocab mapping) and ``build_launch_plan`` (the
producer and consumer processes it would start). The planner reads run.yaml only, plus the
environment (``RANK``/``WORLD_SIZE`` of an enclosing torchrun) and whether the consumer's
metadata database (``control_dir/consumer.sqlite``) is already there; it opens neither the
target checkpoint nor the draft config, the data or the vocab mapping.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from regen.core.errors import ConfigError
from regen.store.layout import SpecForgePlanRecord
from regen.train.config import TrainConfig

log = logging.getLogger(__name__)

DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"
STRATEGY = "eagle3"


def draft_config(cfg: TrainConfig, aux_ids_specforge: list[int]) -> dict[str, object]:
    """The draft's config.json as SpecForge's EAGLE-3 model reads it."""
    d = cfg.draft
    out: dict[str, object] = {
        "architectures": [DRAFT_ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": d.hidden_size,
        "target_hidden_size": cfg.target.hidden_size,
        "num_hidden_layers": d.num_layers,
        "intermediate_size": d.intermediate_size,
        "num_attention_heads": d.num_attention_heads,
        "num_key_value_heads": d.num_key_value_heads,
        "max_position_embeddings": d.max_position_embeddings,
        "rope_theta": d.rope_theta,
        "rms_norm_eps": d.rms_norm_eps,
        "hidden_act": "silu",
        "vocab_size": d.vocab_size,
        "draft_vocab_size": d.draft_vocab_size,
        "pad_token_id": d.pad_token_id,
        "tie_word_embeddings": False,
        "torch_dtype": cfg.target.torch_dtype,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(aux_ids_specforge),
            "use_aux_hidden_state": True,
        },
    }
    if d.head_dim is not None:
        out["head_dim"] = d.head_dim
    return out


def run_config(
    cfg: TrainConfig,
    *,
    aux_ids_specforge: list[int],
    draft_config_path: str,
    prompts_path: str,
    run_id: str,
    control_dir: str,
    vocab_mapping_path: str,
) -> dict[str, Any]:
    """The SpecForge run config as a plain mapping (written as run.yaml)."""
    t, dep = cfg.training, cfg.deployment
    training: dict[str, object] = {
        "strategy": STRATEGY,
        "num_epochs": t.epochs,
        "batch_size": t.batch_size,
        "learning_rate": t.lr,
        "max_grad_norm": t.max_grad_norm,
        "ttt_length": t.ttt_length,
        "attention_backend": t.attention_backend,
        "tp_size": t.tp_size,
        "save_interval": t.save_interval,
        "log_interval": t.log_interval,
        "dist_timeout": t.dist_timeout,
        "seed": t.seed,
    }
    if t.max_steps is not None:
        training["max_steps"] = t.max_steps
    trainer: dict[str, object] = {"nnodes": dep.nnodes, "nproc_per_node": dep.nproc_per_node}
    if dep.master_addr:
        trainer["master_addr"] = dep.master_addr
    disagg: dict[str, object] = {
        "control_dir": control_dir,
        "backend": "mooncake",
        "server_urls": list(cfg.capture.server_urls),
    }
    if dep.consumer_state_dir:
        disagg["consumer_state_dir"] = dep.consumer_state_dir
    if cfg.capture.mooncake is not None:
        m = cfg.capture.mooncake
        disagg["mooncake_metadata_server"] = m.metadata_server
        disagg["mooncake_master_server_addr"] = m.master_server_addr
        disagg["mooncake_protocol"] = m.protocol
    return {
        "run_id": run_id,
        "output_dir": cfg.output_dir,
        "model": {
            "target_model_path": cfg.target.path,
            "draft_model_config": draft_config_path,
            "aux_hidden_state_layer_ids": list(aux_ids_specforge),
            "embedding_key": cfg.target.embedding_key,
            "lm_head_key": cfg.target.lm_head_key,
            "vocab_mapping_path": vocab_mapping_path,
            "trust_remote_code": cfg.target.trust_remote_code,
            "torch_dtype": cfg.target.torch_dtype,
        },
        "data": {"prompts_path": prompts_path, "max_length": t.max_length},
        "training": training,
        "deployment": {"mode": dep.mode, "trainer": trainer, "disaggregated": disagg},
    }


def specforge_available() -> bool:
    try:
        import specforge.config  # noqa: F401
    except ImportError:
        return False
    return True


def plan_with_specforge(run_yaml: str | Path, *, where: str) -> SpecForgePlanRecord:
    """SpecForge's own planning of run.yaml (what ``specforge train --config run.yaml --plan``
    runs); ConfigError with SpecForge's reason when it refuses the run."""

    from specforge.application import resolve_run
    from specforge.config import load_config
    from specforge.launch_plan import build_launch_plan

    try:
        resolved = resolve_run(load_config(str(run_yaml)))
        plan = build_launch_plan(
            resolved.config, algorithm=resolved.algorithm, config_path=str(run_yaml)
        )
    except Exception as e:  # pydantic.ValidationError and ValueError: SpecForge's refusals
        reason = " ".join(str(e).split())
        raise ConfigError(f"SpecForge's planner refuses {run_yaml}: {reason}") from None
    return SpecForgePlanRecord(
        where=where, at=time.time(), kind=plan.kind, role=plan.role, plan=json.loads(plan.render())
    )


def check_run_config_shape(run: dict[str, Any]) -> None:
    """Our own structural checks of run.yaml (independent of SpecForge being installed)."""
    t, m, d = run["training"], run["model"], run["data"]
    if t["strategy"] != STRATEGY:
        raise ConfigError(f"run config training.strategy is {t['strategy']!r}, not eagle3")
    if not d.get("prompts_path") or any(
        d.get(k) for k in ("train_data_path", "hidden_states_path")
    ):
        raise ConfigError("run config data must name exactly prompts_path (pre-tokenized rows)")
    if len(m["aux_hidden_state_layer_ids"]) != 3:
        raise ConfigError("run config model.aux_hidden_state_layer_ids must hold 3 layer ids")
    if not m.get("vocab_mapping_path"):
        raise ConfigError("run config model.vocab_mapping_path must name the draft's mapping")


def write_yaml(path: Path, obj: Mapping[str, object]) -> None:
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(yaml.safe_dump(obj, sort_keys=False), encoding="utf-8")
    tmp.replace(path)
