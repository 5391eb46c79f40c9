"""Our own checks of a train config, run before submitting and again on the cluster.

Applies every trap of :mod:`regen.train.traps` to a :class:`TrainConfig`, and, where the target
checkpoint is readable (on the cluster), compares the config's numbers with the target's own
``config.json``. Reads ``TARGET/config.json``; owns no files.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from regen.core.errors import ConfigError, TrapError
from regen.targets import Family
from regen.template.tokenizer import load_tokenizer as load_target_tokenizer
from regen.train import traps
from regen.train.config import TrainConfig

log = logging.getLogger(__name__)


def check_train_config(cfg: TrainConfig) -> list[int]:
    """Refuse every trap visible in the config alone; return aux ids in SpecForge numbering."""
    traps.check_algorithm(cfg.draft.algorithm, "draft.algorithm")
    traps.check_algorithm(cfg.capture.speculative_algorithm, "capture.speculative_algorithm")
    traps.check_algorithm(cfg.serving.speculative_algorithm, "serving.speculative_algorithm")
    aux = traps.check_aux_layer_ids(
        cfg.draft.aux_layer_ids, cfg.draft.layer_numbering, cfg.target.num_layers
    )
    family = cfg.target.model_family()
    if family is not None and family.aux_shift == "unsupported":
        traps.check_capture(family.title)
    if aux_shift_applies(family):
        traps.check_aux_shift(aux)
    traps.check_fc_width(aux, cfg.target.hidden_size, cfg.draft.fc_input_size)
    traps.check_draft_hidden(cfg.draft.hidden_size, cfg.target.hidden_size)
    traps.check_vocab(
        target_vocab=cfg.target.vocab_size,
        draft_vocab=cfg.draft.vocab_size,
        draft_vocab_size=cfg.draft.draft_vocab_size,
        tokenizer_size=cfg.target.tokenizer_size,
    )
    _check_deployment(cfg)
    return aux


def _check_deployment(cfg: TrainConfig) -> None:
    dep = cfg.deployment
    if dep.mode != "disaggregated":
        raise ConfigError(
            "deployment.mode: pre-tokenized prompts train online, which SpecForge runs only "
            "as deployment.mode=disaggregated",
            field="deployment.mode",
        )
    if cfg.training.tp_size != 1:
        raise ConfigError(
            "training.tp_size: SpecForge's online consumer needs trainer tp_size 1 (target "
            "tensor parallelism belongs to the capture servers)",
            field="training.tp_size",
        )
    if dep.nnodes > 1 and not dep.master_addr:
        raise ConfigError(
            "deployment.master_addr is required when nnodes > 1", field="deployment.master_addr"
        )
    if dep.nnodes > 1 and not dep.consumer_state_dir:
        raise ConfigError(
            "deployment.consumer_state_dir is required when nnodes > 1",
            field="deployment.consumer_state_dir",
        )


def text_config(raw: dict[str, object]) -> dict[str, object]:
    """The language-model part of a (possibly multimodal, e.g. K2.5) config.json."""
    inner = raw.get("text_config")
    return inner if isinstance(inner, dict) else raw


def read_target_config(path: str) -> dict[str, object] | None:
    """The target's config.json (its text part), or None when it is not readable here."""
    f = Path(path) / "config.json"
    try:
        return text_config(json.loads(f.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tiktoken.model")


def load_tokenizer(path: str, *, trust_remote_code: bool) -> Any | None:
    """The target's own tokenizer, or None when it is not loadable here."""
    if not any((Path(path) / f).exists() for f in TOKENIZER_FILES):
        return None
    try:
        return load_target_tokenizer(path, trust_remote_code)
    except Exception as e:  # any loader failure only skips the checks that need it
        log.warning("tokenizer of %s not loadable here (%s); not checked with it", path, e)
        return None


def tokenizer_size(path: str, *, trust_remote_code: bool) -> int | None:
    """len() of the target's own tokenizer, or None when it is not loadable here."""
    tok = load_tokenizer(path, trust_remote_code=trust_remote_code)
    return None if tok is None else len(tok)


def aux_shift_applies(family: Family | None) -> bool:
    """Whether SGLang's loader of ``family`` adds 1 to the aux ids only when the first is 1
    (DeepSeek-V2 and Kimi loaders; docs/targets.md). An unknown family is held to it too: a
    list that starts at 1 is captured right by every loader."""
    return family is None or family.aux_shift == "first_is_one"


def turn_open_ids(cfg: TrainConfig) -> frozenset[int] | None:
    """Ids of the target family's turn-opening tokens, for the loss-mask scan.

    From the target's own tokenizer when it is loadable here; else the family's published ids
    when ``target.vocab_size`` is its published vocabulary's; else None (the scan then checks
    only the first token and all-trained masks).
    """
    family = cfg.target.model_family()
    if family is None:
        log.warning("the target's model family is unknown: the loss-mask scan checks only the "
                    "first token and all-trained masks")  # fmt: skip
        return None
    tok = load_tokenizer(cfg.target.path, trust_remote_code=cfg.target.trust_remote_code)
    if tok is not None:
        unk = getattr(tok, "unk_token_id", None)
        ids = [tok.convert_tokens_to_ids(t) for t in family.turn_open_tokens]
        found = frozenset(int(i) for i in ids if i is not None and i != unk)
        if found:
            return found
    published = {family.published_ids.get(t) for t in family.turn_open_tokens} - {None}
    if cfg.target.vocab_size == family.published_vocab and published:
        return frozenset(i for i in published if i is not None)
    log.warning("no %s turn-opening token ids known for %s: the loss-mask scan checks only "
                "the first token and all-trained masks", family.title, cfg.target.path)  # fmt: skip
    return None


def check_target_files(cfg: TrainConfig) -> None:
    """Where the target checkpoint is readable: its config.json numbers and tokenizer size."""
    target = read_target_config(cfg.target.path)
    if target is None:
        log.warning("target %s/config.json is not readable here; shape not checked",
                    cfg.target.path)  # fmt: skip
        return
    check_against_target(cfg, target)
    size = tokenizer_size(cfg.target.path, trust_remote_code=cfg.target.trust_remote_code)
    if size is not None:
        traps.check_vocab(
            target_vocab=cfg.target.vocab_size,
            draft_vocab=cfg.draft.vocab_size,
            draft_vocab_size=cfg.draft.draft_vocab_size,
            tokenizer_size=size,
        )


def check_against_target(cfg: TrainConfig, target: Mapping[str, object]) -> None:
    """The config's target numbers must be the target's own (layers, hidden, vocab)."""
    pairs = [
        ("target.num_layers", cfg.target.num_layers, target.get("num_hidden_layers")),
        ("target.hidden_size", cfg.target.hidden_size, target.get("hidden_size")),
        ("target.vocab_size", cfg.target.vocab_size, target.get("vocab_size")),
    ]
    for field, mine, theirs in pairs:
        if theirs is not None and mine != theirs:
            trap = traps.TRAP_VOCAB if field == "target.vocab_size" else traps.TRAP_TARGET_SHAPE
            raise TrapError(
                trap,
                f"{field} is {mine} but {cfg.target.path}/config.json says {theirs}; every "
                "layer-id and width check would be checked against the wrong model.",
                f"set {field} to {theirs}.",
            )
