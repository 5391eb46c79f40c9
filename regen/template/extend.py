"""Token ids of a conversation's successive prompts, each encoded only where it differs from the
prompt before. Owns no files.

The prompt of turn k+1 is usually the prompt of turn k, then the answer, then the next user
turn: the text of the earlier prompt is a prefix of the later one. Not always: the Kimi
templates drop the reasoning of every assistant turn up to the last one without tool calls
(CONTRACTS §1), so when a plain answer follows turns that called tools, those turns are
rendered again without their reasoning and the history is rewritten from there on. Nothing is
assumed: both prompts are rendered in full by the template (text only, which is cheap), and
the later one reuses the earlier one's ids only up to where their texts agree:

- the earlier text is a prefix of the later one and ends with a boundary token: all its ids,
  then the ids of the rest (``extended``);
- otherwise the longest common prefix, cut after the last boundary token in it: the earlier
  ids up to that token, then the ids of the rest (``common_prefix``);
- no boundary token in common: the whole text (``full``).

A boundary token is one of the chat format's special tokens (``<|im_end|>``, ``<|im_middle|>``,
``<think>``, ...) that the tokenizer encodes as one id and that splits its input: text on
either side is tokenized on its own, so ids(A + B) = ids(A) + ids(B) when A ends with one.
:class:`Boundaries` keeps only the tokens for which that holds on probe strings, and
:class:`PromptIds` compares its first ``verify`` reuses of each kind with a whole encode: at
the first difference it logs a warning and encodes every prompt whole from then on. ``stats``
counts
the cases (``first``: the first prompt of a conversation; ``verified_KIND``, ``mismatch``);
``benchmarks/cpu.py`` reports them.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from regen.template.codec import TokenCodec

log = logging.getLogger(__name__)

#: text the boundary probes put after a token (tokenized on its own, as the rule needs)
_AFTER = (" x", "\n\ny", "x", "  ", "<think>", "</think>", "")
#: reuses checked against a whole encode before the rule is trusted
VERIFY_FIRST = 16


class Boundaries:
    """The special tokens after which a text can be cut without changing its ids."""

    def __init__(self, codec: TokenCodec, candidates: Sequence[str]) -> None:
        tok = codec.tokenizer
        unk = getattr(tok, "unk_token_id", None)
        ok: dict[str, int] = {}
        for s in candidates:
            tid = tok.convert_tokens_to_ids(s)
            if not isinstance(tid, int) or tid == unk or codec.encode_many([s]) != [[tid]]:
                continue
            wholes = codec.encode_many([f"a {s}{b}" for b in _AFTER])
            parts = codec.encode_many([f"a {s}", *_AFTER])
            if all(w == parts[0] + p for w, p in zip(wholes, parts[1:], strict=True)):
                ok[s] = tid
        #: token text -> id
        self.tokens = ok
        self.ids = frozenset(ok.values())
        self._re = re.compile("|".join(map(re.escape, sorted(ok, key=len, reverse=True))))

    def ends_with_one(self, text: str) -> bool:
        return any(text.endswith(s) for s in self.tokens)

    def last_cut(self, text: str, limit: int) -> tuple[int, int]:
        """(end of the last boundary token within ``text[:limit]``, how many such tokens up to
        it); (0, 0) when there is none."""
        if not self.tokens:
            return 0, 0
        end = count = 0
        for m in self._re.finditer(text, 0, limit):
            end, count = m.end(), count + 1
        return end, count

    def ids_through(self, ids: Sequence[int], count: int) -> int:
        """Index just after the ``count``-th boundary id in ``ids`` (-1 when there are fewer)."""
        seen = 0
        bound = self.ids
        for i, t in enumerate(ids):
            if t in bound:
                seen += 1
                if seen == count:
                    return i + 1
        return -1


@dataclass(slots=True, frozen=True)
class IdsRecipe:
    """How one prompt's ids are made: ``piece`` encoded, after ``keep`` ids of the one before
    (``keep`` None: the whole text is the piece; -1: all of the earlier ids; n >= 0: the
    earlier ids through the n-th boundary id). ``kind``: ``first`` (no prompt before),
    ``extended``, ``common_prefix`` or ``full`` (a prompt before, nothing reusable)."""

    piece: str
    keep: int | None = None
    kind: str = "full"


class PromptIds:
    """Plans and assembles prompt ids over a :class:`TokenCodec` (see the module docstring)."""

    def __init__(self, codec: TokenCodec, boundaries: Boundaries, verify: int = VERIFY_FIRST):
        self.codec = codec
        self.boundaries = boundaries
        self.enabled = bool(boundaries.tokens)
        self.verify = verify
        self.stats: Counter[str] = Counter()

    def plan(self, text: str, before: str | None) -> IdsRecipe:
        """How to make the ids of ``text`` given the prompt ``before`` it (None: none)."""
        if before is None:
            return IdsRecipe(text, None, "first")
        if not self.enabled:
            return IdsRecipe(text)
        b = self.boundaries
        if text.startswith(before) and b.ends_with_one(before):
            return IdsRecipe(text[len(before) :], -1, "extended")
        common = _common_prefix(before, text)
        end, count = b.last_cut(before, common)
        if count == 0:
            return IdsRecipe(text)
        return IdsRecipe(text[end:], count, "common_prefix")

    def assemble(
        self, plan: IdsRecipe, before_ids: Sequence[int] | None, piece_ids: list[int]
    ) -> list[int] | None:
        """The prompt's ids; None when the earlier ids do not hold the boundary the plan needs
        (encode it whole then)."""
        if plan.keep is None:
            return piece_ids
        assert before_ids is not None
        if plan.keep == -1:
            return [*before_ids, *piece_ids]
        cut = self.boundaries.ids_through(before_ids, plan.keep)
        return None if cut < 0 else [*before_ids[:cut], *piece_ids]

    def checking(self, kind: str) -> bool:
        """Whether the next reuse of this kind is compared with a whole encode."""
        return self.enabled and self.stats[f"verified_{kind}"] < self.verify

    def checked(self, kind: str, ok: bool) -> None:
        """The outcome of one comparison: a difference turns reuse off for good."""
        if ok:
            self.stats[f"verified_{kind}"] += 1
            return
        self.stats["mismatch"] += 1
        if self.enabled:
            log.warning(
                "prompt ids reused across turns (%s) differ from a whole encode with this "
                "tokenizer: encoding every prompt whole from now on",
                kind,
            )
        self.enabled = False


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (slices compared in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
