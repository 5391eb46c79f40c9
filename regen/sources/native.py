"""Validation of native (already in the target's format, pre-tokenized) rows.

A native row is passed through bit-exact: its ``input_ids`` and ``loss_mask`` are never
re-tokenized, re-rendered or truncated. Before that, :func:`validate_native` checks it against
the target tokenizer's vocabulary (:class:`VocabInfo`); structural checks of the raw JSON happen
in the kimi_native source adapter. Owns no files.

Reason codes (stable, used for counting): ``length_mismatch``, ``empty``, ``mask_value``,
``id_type``, ``id_out_of_vocab``, ``no_turn_tokens``, ``mask_all_zero``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from numbers import Integral

from regen.core.errors import TemplateError
from regen.core.sample import Sample
from regen.targets import Family
from regen.template.tokenizer import load_tokenizer


@dataclass(slots=True, frozen=True)
class VocabInfo:
    """What native-row validation needs from the target tokenizer."""

    vocab_size: int  #: valid ids are 0 <= id < vocab_size
    turn_token_ids: frozenset[int]  #: ids of the family's native turn tokens, all required

    @classmethod
    def from_tokenizer(cls, tokenizer: object, family: Family | None) -> VocabInfo:
        """From a loaded transformers tokenizer (``len(tok)`` counts added special tokens) of
        the target ``family``, whose ``native_turn_tokens`` every native row must hold."""
        turn_tokens = family.native_turn_tokens if family is not None else None
        if family is None or turn_tokens is None:
            what = family.title if family is not None else "the target's (unknown) family"
            raise TemplateError(f"native rows: {what} has no native-row format (docs/targets.md)")
        ids = []
        for t in turn_tokens:
            i = tokenizer.convert_tokens_to_ids(t)  # type: ignore[attr-defined]
            if i is None or i == getattr(tokenizer, "unk_token_id", None):
                raise TemplateError(f"tokenizer has no {t!r} token: not a {family.title} tokenizer")
            ids.append(int(i))
        return cls(vocab_size=len(tokenizer), turn_token_ids=frozenset(ids))  # type: ignore[arg-type]

    @classmethod
    def from_dir(
        cls,
        path: str | os.PathLike[str],
        family: Family | None,
        *,
        trust_remote_code: bool = False,
    ) -> VocabInfo:
        """Load the tokenizer directory (transformers) and read its vocabulary facts."""
        return cls.from_tokenizer(load_tokenizer(path, trust_remote_code), family)


def validate_native(sample: Sample, vocab_info: VocabInfo) -> str | None:
    """The reason code why a native sample cannot be trained on, or None when it is valid."""
    ids, mask = sample.input_ids, sample.loss_mask
    if ids is None or mask is None or len(ids) != len(mask):
        return "length_mismatch"
    if not ids:
        return "empty"
    if any(not _is_int(m) or m not in (0, 1) for m in mask):
        return "mask_value"
    if not all(_is_int(i) for i in ids):
        return "id_type"
    if min(ids) < 0 or max(ids) >= vocab_info.vocab_size:
        return "id_out_of_vocab"
    if not vocab_info.turn_token_ids.issubset(ids):
        return "no_turn_tokens"
    if not any(mask):
        return "mask_all_zero"
    return None


def _is_int(v: object) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)
