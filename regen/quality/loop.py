"""Find a loop in an answer while it streams, so the stream can be closed (``quality.loop_cut``).

An answer that falls into a loop ("Wait, let me check. Wait, let me check. ...") keeps its
server busy until ``max_tokens`` (16,384 in the reference manifest: about twelve median
answers), and every token of it is flagged ``repetition`` and dropped afterwards.
:class:`LoopWatch` looks at the answer as it grows: every :attr:`LoopCut.every` streamed tokens
it measures the last :attr:`LoopCut.window_words` words (reasoning and content together, as
:func:`regen.quality.check_turn` does) with :func:`~regen.quality.repetition.longest_repeat`
(the first words of the window may be cut mid-word: a run of the loop does not care);
a back-to-back run of one n-gram covering at least ``min_words`` words in at least
``min_copies`` copies is a loop. The client then closes the stream (SGLang and vLLM abort a
request whose stream is closed: docs/quality.md), and the turn is stored as it stood, with
finish reason :data:`regen.core.result.LOOP` and the ``repetition`` flag.

What a look costs: one join of the window's pieces and one ``longest_repeat`` of ~400 words
(~0.3 ms); at the defaults, one look per 64 tokens (a few µs per token). The watch reads the
accumulator's text lists where they stand and keeps only indices, so nothing is copied per
token. Tokens are counted as text pieces streamed (SGLang sends one token per chunk) or, when
the server streams them, the ids (vLLM's ``token_ids``). Owns no files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from regen.core.text import words
from regen.quality.config import LoopCut
from regen.quality.repetition import repeat_in_words

#: characters a word of the window takes at most, on average, before the window is cut shorter
#: (a piece list can be long; joining only the tail keeps each look bounded)
_CHARS_PER_WORD = 16


class Streamed(Protocol):
    """What a look reads: the text pieces streamed so far (regen.client.stream's accumulator)."""

    reasoning: list[str]
    content: list[str]


@dataclass(slots=True)
class LoopWatch:
    """The loop detector of one streamed answer (module docstring)."""

    cut: LoopCut
    #: longest n-gram looked for (``quality.repeat_max_ngram``)
    max_ngram: int = 64
    #: tokens streamed when the next look is due
    next_at: int = field(init=False)
    #: what the last look found: (words in the longest back-to-back run, its n-gram)
    found: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        self.next_at = self.cut.every

    def due(self, tokens: int) -> bool:
        """Whether ``tokens`` streamed call for a look (cheap: one comparison)."""
        return tokens >= self.next_at

    def loops(self, answer: Streamed, tokens: int) -> bool:
        """Look at the answer's tail (the text pieces streamed so far); True: it loops."""
        self.next_at = tokens + self.cut.every
        chars = self.cut.window_words * _CHARS_PER_WORD
        text = tail_text(answer.reasoning, answer.content, chars)
        run, ngram = repeat_in_words(words(text)[-self.cut.window_words :], self.max_ngram)
        self.found = (run, ngram)
        return run >= self.cut.min_words and ngram > 0 and run >= self.cut.min_copies * ngram


def tail_text(reasoning: Sequence[str], content: Sequence[str], chars: int) -> str:
    """The last ~``chars`` characters of reasoning + content, joined as the quality check joins
    them (a newline between the two when both have text)."""
    parts = _tail(content, chars)
    left = chars - sum(len(p) for p in parts)
    if left > 0 and reasoning:
        head = _tail(reasoning, left)
        return "".join(head) + ("\n" if parts else "") + "".join(parts)
    return "".join(parts)


def _tail(pieces: Sequence[str], chars: int) -> list[str]:
    """The last pieces of ``pieces`` holding at least ``chars`` characters (all when fewer)."""
    n, i = 0, len(pieces)
    while i > 0 and n < chars:
        i -= 1
        n += len(pieces[i])
    return list(pieces[i:])
