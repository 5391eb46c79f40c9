"""Repetition measures of an answer: the longest back-to-back run of one n-gram, and how well the
text compresses.

``longest_repeat(text)``: over the words of :func:`regen.core.text.words`, the longest stretch made
of two or more back-to-back copies of one n-gram (``n`` ≤ ``max_ngram``), as ``(words, n)``. A model
that loops ("Wait, let me check. Wait, let me check. ...") makes a long stretch with a small
``n``; a legitimate list or refrain rarely repeats itself word for word more than a few times.
A period-``n`` stretch is found where ``word[i] == word[i + n]`` holds for consecutive ``i``:
a run of ``L`` such positions is a stretch of ``L + n`` words. All periods are compared at once
(a ``max_ngram`` × words boolean matrix, its longest runs from one running maximum): about
0.2 ms for a 300-token answer, a few milliseconds for 20,000 words.

``compression_ratio(text)``: zlib-compressed bytes over UTF-8 bytes (level 6). Prose is
around 0.35-0.5, code 0.2-0.35; a text that repeats itself, even loosely, falls far lower.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from regen.core.text import words

if TYPE_CHECKING:
    import numpy as np


def longest_repeat(text: str, max_ngram: int) -> tuple[int, int]:
    """``(words in the longest back-to-back repetition, its n-gram size)``; ``(0, 0)`` when no
    n-gram follows itself (ties: the smallest n)."""
    return repeat_in_words(words(text), max_ngram)


def repeat_in_words(ws: Sequence[str], max_ngram: int) -> tuple[int, int]:
    """:func:`longest_repeat` of words already split (:func:`regen.core.text.words`)."""
    import numpy as np  # here, not at import: the manifest imports regen.quality

    ids = np.fromiter((hash(w) for w in ws), dtype=np.int64, count=len(ws))
    spans = repeat_spans(ids, max_ngram)
    if not len(spans):
        return 0, 0
    best = int(np.argmax(spans))
    if spans[best] == 0:
        return 0, 0
    return int(spans[best]), best + 1


def repeat_spans(ids: np.ndarray, max_ngram: int) -> np.ndarray:
    """Per n-gram size ``n`` = 1 .. min(max_ngram, words // 2) (index ``n - 1``): the words in
    the longest back-to-back run of one n-gram over word ids ``ids`` (0: no two whole copies)."""
    import numpy as np

    n_words = len(ids)
    k = min(max_ngram, n_words // 2)
    if k < 1:
        return np.zeros(0, dtype=np.int64)
    # row n-1: word[i] == word[i + n] (padded with False), for every period n at once
    eq = np.zeros((k, n_words), dtype=bool)
    for n in range(1, k + 1):
        eq[n - 1, : n_words - n] = ids[n:] == ids[:-n]
    pos = np.arange(n_words)
    last_false = np.maximum.accumulate(np.where(eq, -1, pos), axis=1)
    runs = (pos - last_false).max(axis=1)  # longest run of True per period
    periods = np.arange(1, k + 1)
    return np.where(runs >= periods, runs + periods, 0)  # at least two whole copies


def compression_ratio(text: str) -> float:
    """zlib-compressed size over raw size of ``text`` in UTF-8 (1.0 for an empty text)."""
    raw = text.encode("utf-8", "surrogatepass")
    if not raw:
        return 1.0
    return len(zlib.compress(raw, 6)) / len(raw)
