"""The run against the training target: was the run tokenized the way the target reads ids?

A run is regenerated with one tokenizer (the run manifest's ``target.tokenizer``); the draft
is trained against the checkpoint of train.yaml's ``target.path``. When the two differ, every
id of the training data means another token to the target: SpecForge trains on it without a
word. Three facts decide, checked in this order and refused with one line naming the field
and both values (:class:`regen.core.errors.TrapError`, trap ``run-vs-target-tokenizer``):

1. **vocab size** — ``len(tokenizer)`` of the run's tokenizer against the target's own
   tokenizer, else train.yaml's ``target.tokenizer_size`` (it must also fit in
   ``target.vocab_size``, the embedding rows);
2. **special-token ids** of the run's model family (regen.targets: its framing and reasoning
   tokens, what the loss mask and the draft depend on; a target of no known family: every
   special token of the run's tokenizer) — against the target's tokenizer, else the family's
   published ids when ``target.vocab_size`` is its published vocabulary's (Kimi's 163,840);
3. **chat template** — the token ids of one probe conversation (system, user, a tool
   declaration, the generation prompt) rendered by each tokenizer's own template, with the
   template's defaults — only when the target's tokenizer is loadable here.

The run's side is recorded in ``RUN_DIR/train/run_tokenizer.json`` (TokenizerRecord) by
``regen train`` on the submitting machine, so the Ray job's preflight can hold it against the
target's own files on the cluster, where the run's tokenizer may not be at hand.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from regen.core.errors import RunDirError, TrapError
from regen.manifest import Manifest
from regen.store import RunDir
from regen.store import layout as L
from regen.store.layout import TokenizerRecord
from regen.store.run import read_manifest
from regen.targets import Family
from regen.targets.decide import agree
from regen.train import traps
from regen.train.checks import load_tokenizer
from regen.train.config import TrainConfig

log = logging.getLogger(__name__)

#: the conversation both templates render for the comparison
PROBE_MESSAGES: list[dict[str, object]] = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "What is 2 + 2? Use the tool if you like."},
]
PROBE_TOOLS: list[dict[str, object]] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]


def special_names(family: Family | None, tok: Any) -> list[str]:
    """The special tokens compared: the family's framing and reasoning tokens and its
    published ones; for a target of no known family every special token of ``tok``."""
    if family is None:
        added = getattr(tok, "added_tokens_decoder", {}) or {}
        return sorted({t.content for t in added.values() if getattr(t, "special", False)})
    think = family.think or ()
    return list(dict.fromkeys((*family.special_tokens, *think, *family.published_ids)))


def tokenizer_record(
    path: str | Path, *, trust_remote_code: bool, family: Family | None = None
) -> TokenizerRecord | None:
    """What the checks compare of the tokenizer in ``path`` (of the model ``family``); None
    when it is not loadable. The probe renders with the template's defaults on both sides
    (template kwargs are a serving choice, not a property of the tokenizer)."""

    tok = load_tokenizer(str(path), trust_remote_code=trust_remote_code)
    if tok is None:
        return None
    unk = getattr(tok, "unk_token_id", None)
    special: dict[str, int | None] = {}
    vocab = tok.get_vocab()
    for name in special_names(family, tok):
        found = vocab.get(name)
        special[name] = None if found is None or found == unk else int(found)
    probe: list[int] | None = None
    if getattr(tok, "chat_template", None):
        try:
            ids = tok.apply_chat_template(
                PROBE_MESSAGES,
                tools=PROBE_TOOLS,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
            probe = [int(i) for i in (ids["input_ids"] if isinstance(ids, dict) else ids)]
        except Exception as e:  # a template that cannot render the probe: not compared
            log.warning("the chat template of %s cannot render the probe (%s)", path, e)
    return TokenizerRecord(
        path=str(path), vocab_size=len(tok), special_ids=special, probe_ids=probe
    )


def run_manifest(rd: RunDir) -> Manifest | None:
    """The run's manifest, its paths resolved from where the run was planned (``regen train``
    reads it once, for the tokenizer check and the export's settings); None, with a warning
    that the run's tokenizer is not checked, when it is missing or does not parse."""
    try:
        manifest = read_manifest(rd)
        plan = L.PLAN_FILE.read(rd)
    except RunDirError as e:
        log.warning("%s: %s; the run's tokenizer is not checked against the target", rd.uri, e)
        return None
    if manifest is None:
        log.warning("%s has no %s: the run's tokenizer is not checked against the target",
                    rd.uri, L.MANIFEST)  # fmt: skip
        return None
    if plan is not None and plan.manifest_dir:
        manifest = manifest.model_copy(update={"base_dir": plan.manifest_dir})
    return manifest


def run_tokenizer(manifest: Manifest | None) -> TokenizerRecord | None:
    """The run's tokenizer (its manifest's ``target.tokenizer``, from :func:`run_manifest`), or
    None when the run has no manifest or the tokenizer is not loadable here."""
    if manifest is None:
        return None
    path = manifest.resolve(manifest.target.tokenizer)
    record = tokenizer_record(path, trust_remote_code=manifest.target.trust_remote_code,
                              family=manifest.family())  # fmt: skip
    if record is None:
        log.warning("the run's tokenizer %s is not loadable here: not checked against the "
                    "target", path)  # fmt: skip
    return record


def check_same_family(cfg: TrainConfig, manifest: Manifest | None) -> None:
    """The run (its manifest, from :func:`run_manifest`) and train.yaml's target are one family
    (regen.targets.decide.agree: a ConfigError naming both when each names one and they
    differ)."""
    if manifest is not None:
        agree(
            ("train.yaml's target", cfg.target.model_family()),
            (f"the run's target {manifest.target.model}", manifest.family()),
        )


def check_run_against_target(
    run: TokenizerRecord | None, target: TokenizerRecord | None, cfg: TrainConfig
) -> None:
    """Refuse the first fact (module docstring) on which ``run`` and the target differ."""
    if run is None:
        return
    where = cfg.target.path
    if run.vocab_size > cfg.target.vocab_size:
        _refuse(
            "tokenizer vocab size", run, f"{run.vocab_size:,} tokens",
            f"{cfg.target.vocab_size:,} embedding rows (target.vocab_size)",
        )  # fmt: skip
    if target is not None:
        theirs: tuple[int, str] | None = (target.vocab_size, f"{where}'s tokenizer")
    elif cfg.target.tokenizer_size is not None:
        theirs = (cfg.target.tokenizer_size, "target.tokenizer_size")
    else:
        theirs = None
    if theirs is not None and theirs[0] != run.vocab_size:
        _refuse(
            "tokenizer vocab size", run, f"{run.vocab_size:,} tokens",
            f"{theirs[0]:,} ({theirs[1]})",
        )  # fmt: skip
    family = cfg.target.model_family()
    if target is not None:
        expected: dict[str, int | None] | None = target.special_ids
        source = f"{where}'s tokenizer"
    elif family is not None and cfg.target.vocab_size == family.published_vocab:
        expected = dict(family.published_ids)
        source = f"the {family.title} tokenizer's published ids"
    else:
        expected, source = None, ""
    for name, want in (expected or {}).items():
        got = run.special_ids.get(name)
        if got != want:
            _refuse(f"special token id {name}", run, str(got), f"{want} ({source})")
    mine, ours = run.probe_ids, target.probe_ids if target is not None else None
    if mine is not None and ours is not None and mine != ours:
        pairs = zip(mine, ours, strict=False)
        at = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(mine), len(ours)))
        _refuse(
            "chat template rendering of the probe conversation", run, f"{len(mine)} ids",
            f"{len(ours)} ids ({where}'s template; first difference at id {at})",
        )  # fmt: skip


def _refuse(field: str, run: TokenizerRecord, mine: str, theirs: str) -> None:
    raise TrapError(
        traps.TRAP_TOKENIZER,
        f"{field}: the run was regenerated with {mine} ({run.path}), the training target has "
        f"{theirs}; every id would mean another token to the target.",
        "train against the target the run was regenerated for (target.path), or regenerate "
        "the run with the target's own tokenizer.",
    )


def target_tokenizer(cfg: TrainConfig) -> TokenizerRecord | None:
    """The training target's own tokenizer facts (None when not loadable here)."""
    return tokenizer_record(cfg.target.path, trust_remote_code=cfg.target.trust_remote_code,
                            family=cfg.target.model_family())  # fmt: skip
