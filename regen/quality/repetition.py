"""Repetition measures of an answer: the longest back-to-back run of one n-gram, and how well the
text compresses.

``longest_repeat(text)``: over the words of :func:`regen.text.words`, the longest stretch made of
two or more back-to-back copies of one n-gram (``n`` ≤ ``max_ngram``), as ``(words, n)``. A model
that loops ("Wait, let me check. Wait, let me check. ...") makes a long stretch with a small
``n``; a legitimate list or refrain rarely repeats itself word for word more than a few times.
A period-``n`` stretch is found where ``word[i] == word[i + n]`` holds for consecutive ``i``:
a run of ``L`` such positions is a stretch of ``L + n`` words. Cost: ``max_ngram`` vectorized
comparisons over the words (a few milliseconds for 20,000 words).

``compression_ratio(text)``: zlib-compressed bytes over UTF-8 bytes (level 6). Prose is
around 0.35-0.5, code 0.2-0.35; a text that repeats itself, even loosely, falls far lower.
"""

from __future__ import annotations

import zlib

import numpy as np

from regen.text import words


def longest_repeat(text: str, max_ngram: int) -> tuple[int, int]:
    """``(words in the longest back-to-back repetition, its n-gram size)``; ``(0, 0)`` when no
    n-gram follows itself."""
    ws = words(text)
    if len(ws) < 2:
        return 0, 0
    ids = np.fromiter((hash(w) for w in ws), dtype=np.int64, count=len(ws))
    best, best_n = 0, 0
    for n in range(1, min(max_ngram, len(ws) // 2) + 1):
        eq = ids[n:] == ids[:-n]
        if not eq.any():
            continue
        run = _longest_true_run(eq)
        span = run + n
        if run >= n and span > best:  # run >= n: at least two whole copies
            best, best_n = span, n
    return best, best_n


def _longest_true_run(mask: np.ndarray) -> int:
    edges = np.diff(np.concatenate(([0], mask.view(np.int8), [0])))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    return int((ends - starts).max())


def compression_ratio(text: str) -> float:
    """zlib-compressed size over raw size of ``text`` in UTF-8 (1.0 for an empty text)."""
    raw = text.encode("utf-8", "surrogatepass")
    if not raw:
        return 1.0
    return len(zlib.compress(raw, 6)) / len(raw)
