"""One family per target, decided by one rule (regen.targets.decide) for `regen run`, `regen
train` and `regen serve-command`, with one refusal where two statements disagree: train.yaml's
target against the run it trains on, serve-command's ``--family`` against its config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from train_fixtures import REPO, kimi_config

from regen.cli.main import main as regen_main
from regen.core.errors import ConfigError
from regen.manifest import load_manifest
from regen.store.run import write_manifest
from regen.store.rundir import RunDir
from regen.targets import FAMILIES
from regen.targets.decide import agree, by_published_vocab, decide_family
from regen.train.config import parse_train_config
from regen.train.target import check_same_family

KIMI_TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"
QWEN3_TOKENIZER = REPO / "manifests" / "demo-qwen3" / "tokenizer"


def test_the_folder_then_the_name_then_the_published_vocabulary(tmp_path: Path) -> None:
    absent = tmp_path / "absent"
    kimi, qwen3 = FAMILIES["kimi"], FAMILIES["qwen3"]
    assert decide_family(None, KIMI_TOKENIZER) is kimi
    assert decide_family("kimi", KIMI_TOKENIZER, vocab_size=1) is kimi
    with pytest.raises(ConfigError, match="'qwen3' contradicts the tokenizer"):
        decide_family("qwen3", KIMI_TOKENIZER)
    assert decide_family("qwen3", absent) is qwen3  # the folder shows none: the name decides
    published = [f for f in FAMILIES.values() if f.published_vocab is not None]
    sizes = [f.published_vocab for f in published]
    family = next(f for f in published if sizes.count(f.published_vocab) == 1)
    size = family.published_vocab
    assert decide_family(None, absent, vocab_size=size) is family
    assert decide_family("qwen3", absent, vocab_size=size) is qwen3  # a name beats the size
    assert decide_family("unknown", absent, vocab_size=size) is None  # none asked for
    # Kimi K2.5 and K3 publish one vocabulary: the size alone tells neither
    assert FAMILIES["kimi_k3"].published_vocab == kimi.published_vocab
    assert by_published_vocab(kimi.published_vocab or 0) is None
    assert decide_family(None, absent) is None


def test_two_statements_naming_two_families_are_refused_naming_both() -> None:
    kimi, qwen3 = FAMILIES["kimi"], FAMILIES["qwen3"]
    agree(("a", kimi), ("b", kimi))
    agree(("a", None), ("b", qwen3))  # a statement of no family contradicts none
    with pytest.raises(ConfigError) as e:
        agree(("train.yaml's target", kimi), ("the run's target m", qwen3))
    assert e.value.field == "target.family"
    assert "train.yaml's target is Kimi" in str(e.value) and "('qwen3')" in str(e.value)


def _run_of(family: str, rd: Path) -> Path:
    """``rd`` holding the demo manifest with ``target.family`` ``family`` and a tokenizer that
    is not at hand (the run's family is then the one recorded)."""
    told = [f"target.family={family}", f"target.tokenizer={rd / 'gone'}"]
    manifest = load_manifest(REPO / "manifests" / "demo.yaml", told)
    write_manifest(RunDir.open(str(rd), create=False), manifest)
    return rd


def test_train_refuses_a_target_of_another_family_than_the_run(
    run_dir: Path, write_train_yaml, capsys
) -> None:
    cfg = parse_train_config(kimi_config())
    kimi_run = load_manifest(REPO / "manifests" / "demo.yaml")
    check_same_family(cfg, kimi_run)  # the demo's tokenizer is Kimi's
    check_same_family(cfg, None)  # no manifest: nothing to hold the config against
    _run_of("qwen3", run_dir)
    rc = regen_main(["train", str(run_dir), "--config", str(write_train_yaml()), "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2 and "one target, two families" in err
    assert "'kimi'" in err and "'qwen3'" in err
    assert not (run_dir / "train" / "run.yaml").exists()


def test_train_takes_a_run_of_the_same_family_or_of_none(run_dir: Path, write_train_yaml) -> None:
    from regen.train.data import open_local
    from regen.train.launch import prepare_training

    _run_of("kimi", run_dir)
    assert prepare_training(open_local(run_dir), write_train_yaml()).scan.rows == 6
    _run_of("unknown", run_dir)
    assert prepare_training(open_local(run_dir), write_train_yaml()).scan.rows == 6


def test_serve_command_refuses_a_family_its_config_or_target_contradicts(
    tmp_path: Path, write_train_yaml, capsys
) -> None:
    draft = tmp_path / "draft"
    draft.mkdir()
    config = write_train_yaml()  # target.family kimi
    base = ["serve-command", str(draft), "--engine", "sglang"]
    assert regen_main([*base, "--config", str(config), "--family", "qwen3"]) == 2
    assert "--family is Qwen3" in capsys.readouterr().err
    assert regen_main([*base, "--target", str(KIMI_TOKENIZER), "--family", "qwen3"]) == 2
    assert "contradicts the tokenizer" in capsys.readouterr().err
    # the config names none: its target's folder decides, and --family agrees with it
    raw = yaml.safe_load(config.read_text())
    raw["target"].update(family=None, path=str(QWEN3_TOKENIZER))
    config.write_text(yaml.safe_dump(raw))
    assert regen_main([*base, "--config", str(config), "--family", "qwen3"]) == 0
    assert "--tool-call-parser" in capsys.readouterr().out
    assert regen_main([*base, "--config", str(config), "--family", "unknown"]) == 0
    assert "--tool-call-parser" not in capsys.readouterr().out
