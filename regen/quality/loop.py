"""Find a loop in an answer while it streams, so the stream can be closed (``quality.loop_cut``).

An answer that falls into a loop ("Wait, let me check. Wait, let me check. ...") keeps its
server busy until ``max_tokens`` (16,384 in the reference manifest: about twelve median
answers), and every token of it is flagged ``repetition`` and dropped afterwards.
:class:`LoopWatch` looks at the answer as it grows: every :attr:`LoopCut.every` streamed tokens
it measures the last :attr:`LoopCut.window_words` words of reasoning and content (joined as
:func:`regen.quality.check_turn` joins them, a newline between the two) with the back-to-back
runs of :mod:`~regen.quality.repetition`: a run of one n-gram covering at least ``min_words``
words in at least ``min_copies`` copies is a loop. The client then closes the stream (SGLang
and vLLM abort a request whose stream is closed: docs/quality.md), and the turn is stored as
it stood, with finish reason :data:`regen.core.result.LOOP` and the ``repetition`` flag.

Incremental: a look reads only the text pieces streamed since the last one (the watch keeps
how many of the accumulator's reasoning and content pieces it has read), splits them into
words as :func:`regen.core.text.words` does, and keeps the ids (hashes) of the last
``window_words`` words; a word the stream may still be writing (the trailing letters of the
text read) waits for the next look. So a look costs the new words and one
``repeat_spans`` over ``window_words`` ids, whatever the answer's length. Tokens are counted
as text pieces streamed (SGLang sends one token per chunk) or, when the server streams them,
the ids (vLLM's ``token_ids``). Owns no files.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from regen.core.text import words
from regen.quality.config import LoopCut
from regen.quality.repetition import repeat_spans

#: the longest unfinished word kept for the next look (a longer run of letters is read as is)
MAX_PENDING = 256


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
    #: the request's ``max_tokens``: a stream that reached it has nothing left to spare
    limit: int | None = None
    #: tokens streamed when the next look is due
    next_at: int = field(init=False)
    #: what the last look found: (words of the longest qualifying run, its n-gram), else the
    #: longest run of any copies
    found: tuple[int, int] = (0, 0)
    _ids: deque[int] = field(init=False)
    _read: list[int] = field(default_factory=lambda: [0, 0])  #: reasoning, content pieces read
    _pending: str = ""  #: trailing letters of the text read: a word the stream may go on with
    _reasoned: bool = False  #: some reasoning text was read (content then follows a newline)
    _in_content: bool = False

    def __post_init__(self) -> None:
        self.next_at = self.cut.every
        self._ids = deque(maxlen=self.cut.window_words)

    def due(self, tokens: int) -> bool:
        """Whether ``tokens`` streamed call for a look (cheap): one is due every ``every``
        tokens, and none once the answer reached ``limit`` (a cut would spare nothing)."""
        return tokens >= self.next_at and (self.limit is None or tokens < self.limit)

    def loops(self, answer: Streamed, tokens: int) -> bool:
        """Look at the answer's tail (the text pieces streamed so far); True: it loops."""
        import numpy as np

        self.next_at = tokens + self.cut.every
        self._take(answer)
        ids = np.fromiter(self._ids, dtype=np.int64, count=len(self._ids))
        spans = repeat_spans(ids, self.max_ngram)
        if not len(spans):
            self.found = (0, 0)
            return False
        periods = np.arange(1, len(spans) + 1)
        ok = (spans >= self.cut.min_words) & (spans >= self.cut.min_copies * periods)
        pick = np.where(ok, spans, 0)
        best = int(np.argmax(pick if ok.any() else spans))
        self.found = (int(spans[best]), best + 1 if spans[best] else 0)
        return bool(ok.any())

    def _take(self, answer: Streamed) -> None:
        """Read the pieces streamed since the last look into the window's word ids."""
        r, c = self._read
        text = "".join(answer.reasoning[r:])
        self._reasoned = self._reasoned or bool(text)
        if len(answer.content) > c:
            if not self._in_content and self._reasoned:
                text += "\n"  # as check_turn joins reasoning and content
            self._in_content = True
            text += "".join(answer.content[c:])
        self._read = [len(answer.reasoning), len(answer.content)]
        text = self._pending + text
        end = len(text)
        while end > 0 and (text[end - 1].isalnum() or text[end - 1] == "_"):
            end -= 1
        if len(text) - end > MAX_PENDING:
            end = len(text)
        self._pending = text[end:]
        self._ids.extend(hash(w) for w in words(text[:end]))
