"""The traps that silently ruin an EAGLE-3 draft, each refused with a TrapError.

Every check is a pure function over numbers (or one pass over the exported JSONL) and raises
:class:`regen.core.errors.TrapError` with ``trap`` set to one of the names below, a message that
says what was found, and the fix. Owns no files.

Layer numbering: SpecForge id ``i`` is the output of decoder layer ``i``; SGLang's capture id is
``i + 1`` (it reads the input of layer ``i + 1``). SpecForge's default choice for ``L`` layers is
``[1, L // 2 - 1, L - 4]`` (61 layers: ``[1, 29, 57]`` = SGLang ``[2, 30, 58]``).

SGLang does not always add that 1: its DeepSeek-V2 loader (which Kimi-K2.5 delegates to,
``models/deepseek_v2.py`` ``set_eagle3_layers_to_capture`` in 0.5.23) adds 1 to the draft's
``eagle_aux_hidden_state_layer_ids`` only when the first id is 1, and uses any other list as
is. A SpecForge list that does not start at layer 1 is therefore captured one layer early at
serving time (:func:`check_aux_shift`). Which loader a target has is its family's
(``Family.aux_shift``, regen.targets; regen.train.checks applies the check where it holds).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import compress
from pathlib import Path

from regen.core.errors import TrapError

EAGLE3 = "EAGLE3"

#: an average acceptance length at or below this means the draft is not helping (a working
#: EAGLE-3 draft for K2.5 reached ~2.1; the EAGLE-vs-EAGLE3 trap gave ~1.0); the same line
#: for SGLang's and vLLM's servers (regen.serve.sglang, regen.serve.vllm)
LOW_ACCEPT_LENGTH = 1.1

TRAP_ALGORITHM = "eagle-vs-eagle3"
TRAP_LAYER_NUMBERING = "aux-layer-numbering"
TRAP_AUX_SHIFT = "aux-layer-shift"
TRAP_FC_WIDTH = "fc-input-width"
TRAP_DRAFT_HIDDEN = "draft-hidden-size"
TRAP_VOCAB = "vocab-size"
TRAP_EMPTY_LOSS_MASK = "empty-loss-mask"
TRAP_MASK_COVERS_PROMPT = "loss-mask-covers-prompt"
TRAP_TARGET_SHAPE = "target-shape"
TRAP_WRONG_DRAFT = "wrong-draft"
TRAP_MALFORMED_DATA = "malformed-training-data"
TRAP_VOCAB_MAPPING = "vocab-mapping"
TRAP_TOKENIZER = "run-vs-target-tokenizer"
TRAP_EXPORT_DROPS = "export-drops"
TRAP_NO_CAPTURE = "no-eagle3-capture"

#: SpecForge's EAGLE-3 fc fuses exactly this many target layers
SPECFORGE_AUX_LAYERS = 3


def check_algorithm(value: str | None, where: str) -> None:
    """Only exactly ``EAGLE3`` makes SGLang capture and concatenate the aux hidden states."""
    if value != EAGLE3:
        raise TrapError(
            TRAP_ALGORITHM,
            f"{where} is {value!r}, not exactly {EAGLE3!r}: an EAGLE-3 draft would receive only "
            "the last layer's hidden state, its fc fusion is skipped without an error and "
            "acceptance length drops to ~1.0.",
            f"set {where} to {EAGLE3} (serving: --speculative-algorithm {EAGLE3}).",
        )


def canonical_aux_ids(num_layers: int) -> list[int]:
    """SpecForge's default aux layers for a target with ``num_layers`` layers."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def to_specforge_ids(ids: Sequence[int], numbering: str) -> list[int]:
    return [i - 1 for i in ids] if numbering == "sglang" else list(ids)


def check_aux_layer_ids(ids: Sequence[int], numbering: str, num_layers: int) -> list[int]:
    """Refuse ids that look like the other tool's numbering; return them in SpecForge numbering.

    "Looks like" is decided by facts that do not depend on taste: an id outside the valid range
    of the declared numbering (SpecForge ``0..L-1``, SGLang ``1..L``; so ``L`` in SpecForge
    numbering and ``0`` in SGLang numbering), and the canonical low/mid/high choice written in
    the other numbering.
    """
    ids = list(ids)
    other = "sglang" if numbering == "specforge" else "specforge"
    fix_field = "draft.aux_layer_ids / draft.layer_numbering"
    if len(set(ids)) != len(ids):
        raise TrapError(
            TRAP_LAYER_NUMBERING,
            f"aux layer ids {ids} repeat a layer.",
            f"list {SPECFORGE_AUX_LAYERS} distinct layers in {fix_field}.",
        )
    sf_canon = canonical_aux_ids(num_layers)
    sg_canon = [i + 1 for i in sf_canon]
    low, high = (0, num_layers - 1) if numbering == "specforge" else (1, num_layers)
    bad = [i for i in ids if not low <= i <= high]
    if bad:
        hint = (
            f"{num_layers} is SGLang numbering of the last layer"
            if numbering == "specforge" and num_layers in bad
            else "0 would capture the embedding: that is SpecForge numbering"
            if numbering == "sglang" and 0 in bad
            else "out of range"
        )
        raise TrapError(
            TRAP_LAYER_NUMBERING,
            f"aux layer ids {ids} declared in {numbering} numbering fall outside "
            f"{low}..{high} for a {num_layers}-layer target ({hint}).",
            f"write the ids in {numbering} numbering (default {num_layers} layers: "
            f"{sf_canon if numbering == 'specforge' else sg_canon}), or set "
            f"draft.layer_numbering: {other} if they were written that way.",
        )
    looks_other = sg_canon if numbering == "specforge" else sf_canon
    if sorted(ids) == looks_other:
        mine = sf_canon if numbering == "specforge" else sg_canon
        raise TrapError(
            TRAP_LAYER_NUMBERING,
            f"aux layer ids {ids} are the default choice for a {num_layers}-layer target "
            f"written in {other} numbering, but the config declares {numbering} numbering "
            f"(off by one: the draft would learn from the wrong layers).",
            f"use {mine} with layer_numbering: {numbering}, or keep {ids} with "
            f"layer_numbering: {other}.",
        )
    return to_specforge_ids(ids, numbering)


def check_aux_shift(specforge_ids: Sequence[int]) -> None:
    """Refuse SpecForge-numbered aux ids that SGLang's DeepSeek-V2 / Kimi-K2.5 loader would
    capture one layer early: it adds 1 to every id only when the first id is 1."""
    ids = list(specforge_ids)
    if not ids or ids[0] == 1:
        return
    served = ids  # used as is
    meant = [i + 1 for i in ids]
    raise TrapError(
        TRAP_AUX_SHIFT,
        f"aux layer ids {ids} (SpecForge numbering) do not start at layer 1. SGLang's "
        "DeepSeek-V2 / Kimi-K2.5 loader adds 1 to the draft's eagle_aux_hidden_state_layer_ids "
        f"only when the first id is 1, so it would capture layers {served} at serving time "
        f"where the draft was trained on {meant}: one layer early, and acceptance drops "
        "without an error.",
        "choose aux layers whose first id is 1 in SpecForge numbering (the default: "
        "[1, L // 2 - 1, L - 4], e.g. [1, 29, 57] for 61 layers).",
    )


def check_capture(family_title: str) -> None:
    """Refuse a target whose SGLang loader captures no EAGLE-3 hidden states (SGLang 0.5.23:
    DeepSeek-V4/V4.1, Kimi K3; ``Family.aux_shift`` ``unsupported``): SpecForge's online
    training captures through SGLang, whose server refuses to start with such a draft."""
    raise TrapError(
        TRAP_NO_CAPTURE,
        f"the target is {family_title}, whose SGLang 0.5.23 loader implements no EAGLE-3 "
        "capture (no set_eagle3_layers_to_capture): SpecForge's capture servers refuse the "
        "draft at start, after the GPUs are allocated.",
        "train this target's draft with vLLM's hidden-state capture, or a target SGLang "
        "captures (docs/targets.md).",
    )


def check_fc_width(
    aux_ids: Sequence[int], target_hidden: int, fc_input_size: int | None = None
) -> int:
    """The draft's fc takes len(aux) x target hidden; SpecForge's takes exactly 3 x hidden."""
    expected = len(aux_ids) * target_hidden
    if len(aux_ids) != SPECFORGE_AUX_LAYERS:
        raise TrapError(
            TRAP_FC_WIDTH,
            f"{len(aux_ids)} aux layers give an fc input of {expected}, but SpecForge's "
            f"EAGLE-3 fc takes {SPECFORGE_AUX_LAYERS} x {target_hidden} = "
            f"{SPECFORGE_AUX_LAYERS * target_hidden}.",
            f"list exactly {SPECFORGE_AUX_LAYERS} aux layers.",
        )
    if fc_input_size is not None and fc_input_size != expected:
        raise TrapError(
            TRAP_FC_WIDTH,
            f"fc input width {fc_input_size} != {len(aux_ids)} aux layers x target hidden "
            f"{target_hidden} = {expected}.",
            f"set draft.fc_input_size to {expected} (or leave it unset).",
        )
    return expected


def check_draft_hidden(draft_hidden: int, target_hidden: int) -> None:
    if draft_hidden != target_hidden:
        raise TrapError(
            TRAP_DRAFT_HIDDEN,
            f"draft hidden size {draft_hidden} != target hidden size {target_hidden}: the "
            "draft reuses the target's embedding and lm head.",
            f"set draft.hidden_size to {target_hidden}.",
        )


def check_vocab(
    *,
    target_vocab: int,
    draft_vocab: int,
    draft_vocab_size: int,
    tokenizer_size: int | None = None,
    max_token_id: int | None = None,
) -> None:
    """Vocabulary sizes must agree with each other, the tokenizer and the data."""
    if draft_vocab != target_vocab:
        raise TrapError(
            TRAP_VOCAB,
            f"draft vocab_size {draft_vocab} != target vocab_size {target_vocab}.",
            f"set draft.vocab_size to {target_vocab}.",
        )
    if draft_vocab_size > target_vocab:
        raise TrapError(
            TRAP_VOCAB,
            f"draft_vocab_size {draft_vocab_size} exceeds the vocabulary {target_vocab}.",
            "set draft.draft_vocab_size to at most the target vocab (EAGLE-3: 32000).",
        )
    if tokenizer_size is not None and tokenizer_size > target_vocab:
        raise TrapError(
            TRAP_VOCAB,
            f"the tokenizer has {tokenizer_size} tokens but the vocab_size is {target_vocab}: "
            "ids past the embedding would be trained on garbage.",
            "use the target's own tokenizer and its config's vocab_size.",
        )
    if max_token_id is not None and max_token_id >= target_vocab:
        raise TrapError(
            TRAP_VOCAB,
            f"the training data holds token id {max_token_id} >= vocab_size {target_vocab}: "
            "it was tokenized with a different tokenizer.",
            "re-export the run with the target's own tokenizer.",
        )


@dataclass(slots=True)
class PromptScan:
    """What one pass over a pre-tokenized JSONL file found."""

    rows: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    max_token_id: int = -1
    empty_mask_rows: int = 0
    covers_prompt_rows: int = 0
    first_empty: str | None = None
    first_covers_prompt: str | None = None


def scan_prompts(
    paths: Iterable[str | Path], turn_open_ids: Collection[int] | None = None
) -> PromptScan:
    """One streaming pass over pre-tokenized rows {"input_ids", "loss_mask"}.

    A mask "covers the prompt" when a turn-opening token (``turn_open_ids``: the ids of the
    target family's ``turn_open_tokens``, regen.targets) is trained: a produced answer never
    holds one. Without those ids only what needs no vocabulary is checked: the first token
    trained (a row always starts with prompt framing) or every token trained. A row that is not
    JSON, lacks a field, or whose ids and mask are not equal-length integer lists is refused
    with a TrapError (``malformed-training-data``) naming the file and line.
    """
    scan = PromptScan()
    opening = frozenset(turn_open_ids or ())
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{n}"
                ids, mask = _parse_row(line, where)
                scan.rows += 1
                scan.tokens += len(ids)
                trained = sum(mask)
                scan.loss_tokens += trained
                if ids:
                    scan.max_token_id = max(scan.max_token_id, max(ids))
                if trained == 0:
                    scan.empty_mask_rows += 1
                    scan.first_empty = scan.first_empty or where
                elif (
                    mask[0] == 1
                    or trained == len(mask)
                    or not opening.isdisjoint(compress(ids, mask))
                ):
                    scan.covers_prompt_rows += 1
                    scan.first_covers_prompt = scan.first_covers_prompt or where
    return scan


def _parse_row(line: str, where: str) -> tuple[list[int], list[int]]:
    """input_ids and loss_mask of one JSONL line, or a TrapError naming the line."""
    fix = "re-export the run with `regen export` (pre-tokenized format)."
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise TrapError(TRAP_MALFORMED_DATA, f"{where} is not JSON ({e}).", fix) from None
    if not isinstance(row, dict) or "input_ids" not in row or "loss_mask" not in row:
        raise TrapError(
            TRAP_MALFORMED_DATA, f"{where} is not an {{input_ids, loss_mask}} object.", fix
        )
    ids, mask = row["input_ids"], row["loss_mask"]
    try:  # C-level checks: this runs over every token of the training data
        ok = (
            isinstance(ids, list)
            and isinstance(mask, list)
            and len(ids) == len(mask)
            and set(mask) <= {0, 1}
            and (not ids or (isinstance(min(ids), int) and isinstance(max(ids), int)))
        )
    except TypeError:  # unorderable or unhashable values
        ok = False
    if not ok:
        raise TrapError(
            TRAP_MALFORMED_DATA,
            f"{where}: input_ids and loss_mask must be equal-length lists of integers "
            "(mask values 0/1).",
            fix,
        )
    return ids, mask


def check_loss_masks(scan: PromptScan) -> None:
    if scan.rows == 0 or scan.empty_mask_rows:
        first = f" (first: {scan.first_empty})" if scan.first_empty else ""
        raise TrapError(
            TRAP_EMPTY_LOSS_MASK,
            f"{scan.empty_mask_rows} of {scan.rows} training rows have an empty loss mask"
            f"{first}; SpecForge drops them silently and trains on less than you think.",
            "re-export the run (the export must drop rows without answer tokens) and check "
            "that the answers were regenerated.",
        )
    if scan.covers_prompt_rows:
        raise TrapError(
            TRAP_MASK_COVERS_PROMPT,
            f"{scan.covers_prompt_rows} of {scan.rows} training rows train on prompt tokens "
            f"(first: {scan.first_covers_prompt}); the draft would learn to predict the "
            "user's text instead of the target's answers.",
            "re-export with loss only on the assistant's produced tokens.",
        )
