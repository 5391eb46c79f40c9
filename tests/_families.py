"""A tokenizer folder of every model family regen knows, for the tests: the committed tiny one
where the family has one (regen.devkit.tokenizers.tiny), else the tiny Kimi BPE with Kimi's
tokens replaced by the family's and its REAL chat template (regen/devkit/tokenizers/templates/),
or no template for a family whose engines encode its prompts in Python. Such a folder is
recognised as its family."""

from __future__ import annotations

import json
from pathlib import Path

from regen.targets import Family

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "regen" / "devkit" / "tokenizers" / "templates"
#: the committed tiny tokenizers, by family
TINY = {
    "kimi": REPO / "manifests" / "demo" / "tokenizer",
    "qwen3": REPO / "manifests" / "demo-qwen3" / "tokenizer",
    "qwen3_coder": REPO / "manifests" / "demo-qwen3-coder" / "tokenizer",
    "deepseek_v3": REPO / "manifests" / "demo-deepseek" / "tokenizer",
    "glm45": REPO / "manifests" / "demo-glm45" / "tokenizer",
}


def has_template(family: Family) -> bool:
    """Whether the family renders with a real template regen holds (not: a family its engines
    encode in Python, or one that publishes none, MiniMax-M3)."""
    return family.name in TINY or (TEMPLATES / f"{family.name}.jinja").is_file()


def family_tokenizer(family: Family, tmp: Path) -> Path:
    """A tokenizer folder of ``family``: the committed tiny one, else the tiny Kimi BPE with
    the family's tokens and its real template (written under ``tmp``)."""
    if family.name in TINY:
        return TINY[family.name]
    from tokenizers import AddedToken, Tokenizer

    data = json.loads((TINY["kimi"] / "tokenizer.json").read_text(encoding="utf-8"))
    data["added_tokens"] = []  # the BPE without Kimi's tokens
    tok = Tokenizer.from_str(json.dumps(data))
    # a think marker is one token, unless it is written with the family's tokens (K3, GPT-OSS)
    think = [t for t in family.think or () if not any(s in t for s in family.special_tokens)]
    tokens = dict.fromkeys((*family.special_tokens, *family.end_tokens(), *think))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens])
    out = tmp / family.name
    out.mkdir(exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config: dict[str, object] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": family.end_of_turn,
    }
    if has_template(family):
        config["chat_template"] = (TEMPLATES / f"{family.name}.jinja").read_text(encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    if family.model_types:  # as a checkpoint's folder says which model it is
        model = {"model_type": family.model_types[0]}
        (out / "config.json").write_text(json.dumps(model), encoding="utf-8")
    return out
