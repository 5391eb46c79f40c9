"""The run config regen writes is accepted by SpecForge 0.2.0's own schema and planner."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from train_fixtures import kimi_config

from regen.core.errors import ConfigError
from regen.train.checks import check_train_config
from regen.train.config import parse_train_config
from regen.train.specforge_config import (
    check_run_config_shape,
    draft_config,
    plan_with_specforge,
    run_config,
    write_yaml,
)

specforge_config = pytest.importorskip("specforge.config")


def _write(tmp_path: Path, **over) -> tuple[Path, dict]:
    cfg = parse_train_config(kimi_config(**over))
    aux = check_train_config(cfg)
    run = run_config(
        cfg,
        aux_ids_specforge=aux,
        draft_config_path=str(tmp_path / "draft.json"),
        prompts_path=str(tmp_path / "p.jsonl"),
        run_id="t",
        control_dir=str(tmp_path / "control"),
        vocab_mapping_path=str(tmp_path / "vocab_mapping.pt"),
    )
    p = tmp_path / "run.yaml"
    write_yaml(p, run)
    return p, run


def test_run_yaml_loads_with_specforge_schema(tmp_path: Path) -> None:
    p, _ = _write(tmp_path, draft={"aux_layer_ids": [2, 30, 58], "layer_numbering": "sglang"})
    loaded = specforge_config.load_config(str(p))
    assert loaded.training.strategy == "eagle3"
    assert loaded.model.aux_hidden_state_layer_ids == [1, 29, 57]  # SpecForge numbering
    assert loaded.model.embedding_key == "language_model.model.embed_tokens.weight"
    assert loaded.model.lm_head_key == "language_model.lm_head.weight"
    assert loaded.model.vocab_mapping_path == str(tmp_path / "vocab_mapping.pt")
    assert loaded.data.prompts_path == str(tmp_path / "p.jsonl")
    assert loaded.mode == "online" and loaded.deployment.mode == "disaggregated"
    assert loaded.deployment.disaggregated.backend == "mooncake"
    assert loaded.training.ttt_length == 7 and loaded.training.max_steps == 10


def test_specforge_plans_a_disaggregated_run_producer_and_consumer(tmp_path: Path) -> None:
    p, _ = _write(tmp_path)
    plan = plan_with_specforge(p, where="submit")
    assert (plan.kind, plan.role) == ("supervisor", "both")
    labels = [c["label"] for c in plan.plan["commands"]]
    assert labels == ["producer", "consumer"]
    consumer = plan.plan["commands"][1]
    assert consumer["env"]["DISAGG_DB"] == str(tmp_path / "control" / "consumer.sqlite")


def test_specforge_planner_refusals_become_one_config_error(tmp_path: Path) -> None:
    p, run = _write(tmp_path)
    run["model"]["vocab_mapping_path"] = ""  # the refusal every launch met before issue 20
    p.write_text(yaml.safe_dump(run))
    with pytest.raises(ConfigError, match=r"require model\.vocab_mapping_path") as ei:
        plan_with_specforge(p, where="submit")
    assert "\n" not in str(ei.value)
    with pytest.raises(ConfigError, match="vocab_mapping_path"):
        check_run_config_shape(run)  # regen's own check says so without SpecForge
    run["model"]["vocab_mapping_path"] = "m.pt"
    run["training"]["no_such_key"] = 1
    p.write_text(yaml.safe_dump(run))
    with pytest.raises(ConfigError, match="no_such_key"):
        plan_with_specforge(p, where="submit")


def test_a_used_consumer_database_is_refused_by_the_planner(tmp_path: Path) -> None:
    p, _ = _write(tmp_path)
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "consumer.sqlite").write_bytes(b"")
    with pytest.raises(ConfigError, match="fresh attempt path"):
        plan_with_specforge(p, where="submit")


def test_draft_config_shape() -> None:
    cfg = parse_train_config(kimi_config())
    d = draft_config(cfg, [1, 29, 57])
    assert d["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (d["hidden_size"], d["target_hidden_size"], d["num_hidden_layers"]) == (7168, 7168, 1)
    assert (d["vocab_size"], d["draft_vocab_size"]) == (163840, 32000)
    assert d["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 29, 57]
