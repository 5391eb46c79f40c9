"""Encode and decode many texts in one call, in the Rust tokenizer when that is provably the same.

Owns no files. ``TokenCodec(tokenizer)`` wraps a transformers tokenizer. A fast tokenizer
(``backend_tokenizer``: the HF ``tokenizers`` Rust object) is called directly and in batches
(``encode_batch_fast``: no offsets; ``decode_batch``) instead of through transformers' per-call
wrapper, which for ``encode(text, add_special_tokens=False)`` and
``decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)`` only sets the
backend's truncation, padding and ``encode_special_tokens`` and converts the result. So the
backend is used only while it is in the state that call would leave it in (no truncation, no
padding, ``encode_special_tokens == split_special_tokens``, checked on every batch), and only
when it gave the same ids and text as the transformers calls on probe strings at construction
(special-token text, whitespace, non-ASCII). Anything else (a slow tokenizer such as Kimi's
tiktoken-based one, a backend in another state) goes through the transformers calls, one text
at a time, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

#: texts the backend must encode (and decode back) exactly as transformers does; the
#: tokenizer's own added tokens are probed too (:func:`probes`)
PROBES = (
    "",
    "Hello, world!",
    "  two  spaces\n\nand\ttabs\r\n",
    "café 日本語 🙂 \u2028",
)


def probes(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """:data:`PROBES`, then the tokenizer's added tokens in text: next to each other, between
    words and after spaces and newlines (special-token text inside a reply)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    tokens = [t.content for _, t in sorted(added.items())][:64]
    glued = "".join(tokens)
    spaced = " x".join(tokens)
    lined = "\n".join(f"A. {t} b" for t in tokens)
    return [*PROBES, glued, spaced, lined] if tokens else list(PROBES)


class TokenCodec:
    """``encode_many`` / ``decode_many`` over one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        backend: Tokenizer | None = getattr(tokenizer, "backend_tokenizer", None)
        self._backend: Tokenizer | None = None
        if backend is not None:
            tokenizer.encode("", add_special_tokens=False)  # leaves the backend as it calls it
            self._backend = backend
            if not (self._ready() and self._agrees(backend)):
                log.debug("tokenizer backend differs from transformers: encoding one by one")
                self._backend = None

    @property
    def batched(self) -> bool:
        """True when the Rust backend is called directly."""
        return self._backend is not None

    def _ready(self) -> bool:
        """Whether the backend is there, in the state transformers leaves it in."""
        b = self._backend
        if b is None:
            return False
        split = bool(getattr(self.tokenizer, "split_special_tokens", False))
        return b.truncation is None and b.padding is None and b.encode_special_tokens == split

    def _agrees(self, b: Tokenizer) -> bool:
        texts = probes(self.tokenizer)
        ids = [self._slow_encode(t) for t in texts]
        return self._fast_encode(b, texts) == ids and self._fast_decode(b, ids) == [
            self._slow_decode(i) for i in ids
        ]

    # -- the two ways -------------------------------------------------------------------
    def _slow_encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _slow_decode(self, ids: Sequence[int]) -> str:
        text = self.tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        if not isinstance(text, str):  # one text for one sequence of ids
            raise TypeError(f"the tokenizer decoded one sequence to {type(text).__name__}")
        return text

    def _fast_encode(self, b: Tokenizer, texts: list[str]) -> list[list[int]]:
        batch = getattr(b, "encode_batch_fast", None) or b.encode_batch
        return [e.ids for e in batch(texts, add_special_tokens=False)]

    def _fast_decode(self, b: Tokenizer, seqs: list[list[int]]) -> list[str]:
        return b.decode_batch(seqs, skip_special_tokens=False)

    # -- the API ------------------------------------------------------------------------
    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text; nothing added around them."""
        if not texts:
            return []
        if self._backend is not None and self._ready():
            return self._fast_encode(self._backend, list(texts))
        return [self._slow_encode(t) for t in texts]

    def decode_many(self, seqs: Sequence[Sequence[int]]) -> list[str]:
        """Text of each id sequence, special tokens kept."""
        if not seqs:
            return []
        if self._backend is not None:
            return self._fast_decode(self._backend, [list(s) for s in seqs])
        return [self._slow_decode(s) for s in seqs]
