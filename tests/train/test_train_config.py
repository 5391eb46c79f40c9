"""train.yaml is strict and documented; the example configs load and pass every check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from train_fixtures import REPO, kimi_config

from regen.core.errors import ConfigError
from regen.train import config as config_mod
from regen.train.checks import check_train_config
from regen.train.config import load_train_config, parse_train_config


def test_example_configs_load_and_pass() -> None:
    cfg = load_train_config(REPO / "manifests" / "train-kimi-k25-eagle3.yaml")
    assert check_train_config(cfg) == [1, 29, 57]
    assert cfg.target.embedding_key == "language_model.model.embed_tokens.weight"
    assert cfg.target.lm_head_key == "language_model.lm_head.weight"
    assert cfg.draft.draft_vocab_size == 32000 and cfg.training.ttt_length == 7
    demo = load_train_config(REPO / "manifests" / "demo-train.yaml")
    assert check_train_config(demo) == [1, 3, 4]  # SpecForge's default for the 8-layer target
    shape = (demo.target.num_layers, demo.target.hidden_size, demo.target.vocab_size)
    assert shape == (8, 64, 1024)
    assert demo.target.lm_head_key == "lm_head.weight" and demo.training.max_steps >= 20


def test_unknown_key_is_refused_with_its_field() -> None:
    with pytest.raises(ConfigError) as ei:
        parse_train_config(kimi_config(training={"learning_rate": 1e-4}))
    assert ei.value.field == "training.learning_rate"


def test_tuning_flags_all_or_none() -> None:
    with pytest.raises(ConfigError):
        parse_train_config(kimi_config(serving={"num_steps": None}))
    cfg = parse_train_config(
        kimi_config(serving={"num_steps": None, "eagle_topk": None, "num_draft_tokens": None})
    )
    assert cfg.serving.num_steps is None


def test_online_training_needs_disaggregated_and_tp1() -> None:
    with pytest.raises(ConfigError) as ei:
        check_train_config(parse_train_config(kimi_config(training={"tp_size": 8})))
    assert ei.value.field == "training.tp_size"
    with pytest.raises(ConfigError):
        check_train_config(parse_train_config(kimi_config(deployment={"mode": "local_colocated"})))


def test_every_field_has_a_doc_comment() -> None:
    src = Path(config_mod.__file__).read_text().splitlines()
    for i, line in enumerate(src):
        m = re.match(r"    (\w+): .*(=|Field|\|)", line)
        if m and not line.strip().startswith(("#", "model_config", "return", "def")):
            assert src[i - 1].strip().startswith("#:"), f"field {m.group(1)} has no #: comment"


def test_a_run_manifest_given_as_the_train_config_is_named_so(capsys) -> None:
    """Issue 31, item 9: `regen train RUN --config manifests/demo.yaml` says a run manifest
    was given where a train config belongs, not "output_dir: Field required"."""
    from pathlib import Path

    from regen.cli.main import main
    from regen.train.config import load_train_config

    demo = Path(__file__).resolve().parents[2] / "manifests" / "demo.yaml"
    with pytest.raises(ConfigError, match="is a run manifest") as e:
        load_train_config(demo)
    assert "output_dir" not in str(e.value).split("not a train config")[0]
    assert main(["train", str(demo.parent), "--config", str(demo), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{demo} is a run manifest (regen run's" in " ".join(err.split())


def test_train_yaml_export_is_the_export_settings_each_optional() -> None:
    """train.yaml's ``export:`` is regen.export.ExportSettings' fields (the manifest's section
    and the drop-share limit), each optional, checked as the run manifest checks them."""
    from regen.export import ExportSettings
    from regen.manifest import Export
    from regen.train.config import TRAIN_EXPORT_SETTINGS, ExportSpec

    assert set(TRAIN_EXPORT_SETTINGS) == {*Export.model_fields, "max_drop_share"}
    assert set(ExportSpec.model_fields) == {*TRAIN_EXPORT_SETTINGS, "dir", "force"}
    assert ExportSpec().given() == {"max_drop_share": 0.5}  # the rest: the run's own
    told = ExportSpec(seed=3, drop_flags="refusal,repetition", holdout=None, keep_unproven=True)
    assert told.given() == {
        "seed": 3, "drop_flags": ["repetition", "refusal"], "keep_unproven": True,
        "max_drop_share": 0.5,
    }  # fmt: skip
    ExportSettings.build(**told.given())  # what it sets, the export takes
    for bad in ({"shard_rows": -1}, {"max_length": 0}, {"drop_flags": "nope"},
                {"max_drop_share": 2}, {"format": "conversations"}):  # fmt: skip
        with pytest.raises(ConfigError) as e:
            parse_train_config(kimi_config(export=bad))
        assert e.value.field == f"export.{next(iter(bad))}"
    for path in sorted((REPO / "manifests").glob("*train*.yaml")):
        cfg = load_train_config(path)
        assert "max_length" not in cfg.export.given() and "holdout" not in cfg.export.given()


def test_one_rule_for_the_longest_row_a_training_export_keeps() -> None:
    """train.yaml's export.max_length, else the run manifest's, else training.max_length."""
    cfg = parse_train_config(kimi_config(training={"max_length": 4096}))
    assert cfg.export_max_length(None) == 4096
    assert cfg.export_max_length(1000) == 1000
    told = parse_train_config(kimi_config(training={"max_length": 4096}, export={"max_length": 99}))
    assert told.export_max_length(1000) == 99 and told.export_max_length(None) == 99
