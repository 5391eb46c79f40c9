"""`regen train` holds a run against a training target of every family regen knows.

Per family: a tokenizer folder holding its special tokens (tests/_families.py) as the run's
and the target's; the record of what is compared names every special token of the family
with its id, the same target passes, and a target whose tokenizer numbers one of them
otherwise is refused naming that token. A family whose SGLang loader captures no EAGLE-3
states (Kimi K3, DeepSeek-V4/V4.1) is refused by the config checks, before any GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from _families import family_tokenizer

from regen.core.errors import TrapError
from regen.targets import FAMILIES
from regen.train.checks import check_train_config
from regen.train.config import parse_train_config
from regen.train.target import check_run_against_target, tokenizer_record

REPO = Path(__file__).resolve().parents[2]


def config_for(folder: Path, family: str) -> object:
    """The demo train config with its target at ``folder`` (and that folder's size)."""
    raw = yaml.safe_load((REPO / "manifests" / "demo-train.yaml").read_text(encoding="utf-8"))
    size = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = len(size["model"]["vocab"]) + len(size["added_tokens"])
    raw["target"].update(path=str(folder), family=family, vocab_size=vocab, tokenizer_size=vocab)
    raw["draft"].update(vocab_size=vocab, draft_vocab_size=min(256, vocab))
    return parse_train_config(raw)


def renumbered(folder: Path, out: Path) -> Path:
    """A copy of ``folder`` whose added tokens come in the reverse order: the same tokens under
    other ids."""
    from tokenizers import AddedToken, Tokenizer

    out.mkdir()
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    added = data["added_tokens"]
    data["added_tokens"] = []
    tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens([AddedToken(t["content"], special=t["special"], normalized=False)
                            for t in reversed(added)])  # fmt: skip
    tok.save(str(out / "tokenizer.json"))
    for f in folder.iterdir():
        if f.name != "tokenizer.json":
            (out / f.name).write_bytes(f.read_bytes())
    return out


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_run_is_held_against_a_target_of_each_family(name: str, tmp_path: Path) -> None:
    fam = FAMILIES[name]
    folder = family_tokenizer(fam, tmp_path)
    run = tokenizer_record(folder, trust_remote_code=False, family=fam)
    assert run is not None
    missing = [t for t in fam.special_tokens if run.special_ids.get(t) is None]
    assert not missing, missing  # every framing token of the family is compared, with its id
    cfg = config_for(folder, name)
    check_run_against_target(run, run, cfg)  # the run's own target: nothing to refuse
    theirs = tokenizer_record(renumbered(folder, tmp_path / "other"), trust_remote_code=False,
                              family=fam)  # fmt: skip
    assert theirs is not None and theirs.special_ids != run.special_ids
    with pytest.raises(TrapError, match=r"special token id \S+: the run was regenerated"):
        check_run_against_target(run, theirs, cfg)


@pytest.mark.parametrize("name", sorted(n for n, f in FAMILIES.items()
                                         if f.aux_shift == "unsupported"))  # fmt: skip
def test_a_target_sglang_cannot_capture_is_refused(name: str, tmp_path: Path) -> None:
    cfg = config_for(family_tokenizer(FAMILIES[name], tmp_path), name)
    with pytest.raises(TrapError, match="no-eagle3-capture") as e:
        check_train_config(cfg)  # type: ignore[arg-type]
    assert FAMILIES[name].title in str(e.value)


def test_the_deepseek_v32_production_config_is_planned_by_specforge(tmp_path: Path) -> None:
    """manifests/train-deepseek-v32-eagle3.yaml (DeepSeek-V3.2's published shapes, 8 GPUs,
    disaggregated): regen's checks pass (first aux id 1: SGLang's DeepSeek-V2 loader captures
    [2, 30, 58]), and SpecForge 0.2.0's own planner accepts the run.yaml regen writes for it."""
    from regen.train.config import load_train_config
    from regen.train.specforge_config import (
        draft_config,
        plan_with_specforge,
        run_config,
        write_yaml,
    )

    cfg = load_train_config(REPO / "manifests" / "train-deepseek-v32-eagle3.yaml")
    assert cfg.target.model_family() is FAMILIES["deepseek_v32"]
    aux = check_train_config(cfg)
    assert aux == [1, 29, 57]
    draft = tmp_path / "draft_config.json"
    draft.write_text(json.dumps(draft_config(cfg, aux)))
    (tmp_path / "vocab_mapping.pt").write_bytes(b"")
    run = run_config(cfg, aux_ids_specforge=aux, draft_config_path=str(draft),
                     prompts_path=str(tmp_path / "prompts.jsonl"), run_id=cfg.run_id,
                     control_dir=str(tmp_path / "control"),
                     vocab_mapping_path=str(tmp_path / "vocab_mapping.pt"))  # fmt: skip
    write_yaml(tmp_path / "run.yaml", run)
    plan = plan_with_specforge(tmp_path / "run.yaml", where="here")
    labels = [c["label"] for c in plan.plan["commands"]]
    assert labels == ["producer", "consumer"], plan.plan
