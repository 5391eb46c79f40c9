"""Greedy answers with and without the draft: speculative decoding must not change them.

At temperature 0 the target alone and the target with its draft must give the same answer to
the same prompt: the draft only proposes, the target's own verification decides every token.
An answer that differs means the speculative server decodes something else (other weights, a
dtype or a template that differs, kernels that are not exact at that batch), and its
acceptance and speedup then describe other answers. The comparison uses the bench's own
concurrency-1 level, where each server answers one request at a time (no batching to differ
by): each prompt's first answered request on each server, by its digest
(:func:`regen.bench.load.answer_digest`: the streamed token ids, else the text). Owns no files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from regen.bench.load import LevelRun, RequestRecord
from regen.bench.report import Greedy

_METHODS: dict[str, Literal["token_ids", "text"]] = {"ids": "token_ids", "text": "text"}


def _answers(levels: Sequence[LevelRun], role: str) -> dict[str, RequestRecord]:
    """Each sample's first answered request at concurrency 1 on ``role``'s server."""
    out: dict[str, RequestRecord] = {}
    for lv in levels:
        if lv.role == role and lv.concurrency == 1:
            for r in lv.records:
                if r.ok and r.answer is not None:
                    out.setdefault(r.sample_id, r)
    return out


def compare_greedy(levels: Sequence[LevelRun], temperature: float | None) -> Greedy | None:
    """The comparison of a bench's levels; None when the sampling is not greedy or no prompt
    was answered by both servers at concurrency 1 by the same method (ids on one side, text
    on the other: a mixed pair is not compared)."""
    if temperature != 0:
        return None
    base, spec = _answers(levels, "baseline"), _answers(levels, "speculative")
    pairs = [(sid, b, spec[sid]) for sid, b in base.items() if sid in spec]
    pairs = [(sid, b, s) for sid, b, s in pairs if _method(b) == _method(s)]
    if not pairs:
        return None
    methods = {_method(b) for _, b, _ in pairs}
    if len(methods) > 1:  # both kinds: the ids are the stronger comparison
        pairs = [(sid, b, s) for sid, b, s in pairs if _method(b) == "ids"]
    differing = [sid for sid, b, s in pairs if b.answer != s.answer]
    return Greedy(
        compared=len(pairs),
        identical=len(pairs) - len(differing),
        method=_METHODS[_method(pairs[0][1])],
        tokens=sum(b.completion_tokens or 0 for _, b, _ in pairs),
        differing=differing,
    )


def _method(rec: RequestRecord) -> str:
    return (rec.answer or "").split(":", 1)[0]
