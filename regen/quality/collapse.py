"""Answer collapse: one answer given to many different prompts of a source (issue 43, part 5).

A target that ignores its prompt — a chat template that drops the user's message, a broken
quantization, a model that fell into one reply — answers every request the same way. One turn
cannot show it, so this check is cross-row: it runs at export (:mod:`regen.export.select`) over
the latest answers of a run, per source, and the rows it finds are flagged ``collapsed`` there
(never stored in a row; the export drops them by default and counts them like other flags).

What is compared (:func:`answer_text`): the whole answer a draft would train on — reasoning,
content and each tool call's name and arguments — as normalized words
(:func:`regen.core.text.words`: NFKC, case folded, punctuation dropped, a CJK character a word).

How (:class:`CollapseFinder`, fed one row at a time, then :meth:`CollapseFinder.groups`):

1. answers of fewer than ``collapse_min_words`` words are not judged: real sources share short
   answers on purpose ("Sure!", "You're welcome! If you have any other questions, feel free to
   ask.", a bare ``finish`` tool call, the demo target's one-sentence answer);
2. **exact**: the other answers are grouped by a 64-bit digest of their words;
3. **near**: one answer per exact group goes through a near index (:class:`NearIndex`), the
   near-duplicate machinery of prompts: :class:`regen.sources.neardup.NearDuplicates` (MinHash
   of word shingles of :data:`SHINGLE` words, :data:`NUM_PERM` permutations, LSH) at
   ``collapse_similarity``, over the answer's first :data:`NEAR_WORDS` words; the export
   hands it in (``regen.export.select.collapse_finder``: sources are floors above this
   package, docs/architecture.md). An answer whose estimated Jaccard similarity with an
   earlier group's first answer reaches it joins that group (the first occurrence leads, as
   for prompts), so the same text with small variations (a name, a number) is one group.
   Without a near index only exact copies are grouped;
4. a group answering at least ``collapse_min_prompts`` **distinct prompts** is collapsed, every
   row in it. A prompt is the source conversation (``content_hash``, else the sample id) and
   the turn: the same question asked twice (a duplicate that dedup kept) is one prompt.

Thresholds are :class:`regen.quality.QualityConfig`'s ``collapse_*`` fields (docs/quality.md
has the measured margin). Memory: about 16 bytes per row fed plus, per distinct answer of
``collapse_min_words`` or more, its digest, first prompt and the near index's ~330 bytes.
Imports nothing heavy. Owns no files.
"""

from __future__ import annotations

import hashlib
import json
import logging
from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from regen.core import jsontext
from regen.core.text import words
from regen.quality.config import DEFAULT_CONFIG, QualityConfig

log = logging.getLogger(__name__)

#: the flag's name (regen.quality.FLAGS)
FLAG = "collapsed"
#: words per shingle of the near match (3: one changed word changes 3 shingles, so a 100-word
#: answer with three words changed still reads ~0.84 similar)
SHINGLE = 3
#: MinHash permutations per signature (as the prompts' default)
NUM_PERM = 128
#: words of an answer's opening the near match compares (the exact match takes them all): a
#: reply that ignores its prompt shows in its opening, and the cost stays bounded (a 12,000-word
#: answer costs what a 512-word one does)
NEAR_WORDS = 512
#: characters of an answer shown with a group
EXAMPLE_CHARS = 120


def answer_text(
    reasoning: str | None, content: str | None, tool_calls: str | Iterable[object] | None
) -> str:
    """The answer as one text: reasoning, content and each tool call's name and arguments
    (``tool_calls`` as stored JSON text or OpenAI dicts)."""
    parts = [reasoning or "", content or ""]
    calls: object = tool_calls
    if isinstance(calls, str):
        try:
            calls = json.loads(calls) if calls else []
        except ValueError:
            calls = [calls]
    for c in jsontext.iterate(calls or ()):
        fn = c.get("function", c) if isinstance(c, Mapping) else None
        if isinstance(fn, Mapping):
            args = fn.get("arguments", "")
            if not isinstance(args, str):
                args = json.dumps(args, ensure_ascii=False, sort_keys=True)
            parts.append(f"{fn.get('name', '')} {args}")
        else:
            parts.append(str(c))
    return "\n".join(p for p in parts if p)


def prompt_key(content_hash: str | None, sample_id: str, turn: int) -> tuple[str, int]:
    """What tells two prompts apart: the source conversation (its ``content_hash``; the
    sample id when a part predates the column) and the regenerated turn."""
    return (content_hash or f"id:{sample_id}", turn)


@dataclass(slots=True)
class CollapseGroup:
    """One answer (exact, or near: with small variations) shared by several prompts."""

    source: str
    prompts: int  #: distinct prompts it answers
    rows: int  #: rows carrying it
    variants: int  #: distinct answers (exact groups) in it
    words: int  #: words of its first answer
    example: str  #: its first answer, shortened

    def to_dict(self) -> dict[str, str | int]:
        return {
            "source": self.source,
            "prompts": self.prompts,
            "rows": self.rows,
            "variants": self.variants,
            "words": self.words,
            "example": self.example,
        }


class Indexed(Protocol):
    """What a near index returns for a match: the id of the indexed answer."""

    @property
    def id(self) -> str: ...


class NearIndex(Protocol):
    """Near matching of one source's answers (:class:`regen.sources.neardup.NearDuplicates`
    has this method): the indexed answer ``text`` is near (its ``id``), or None after
    indexing ``item`` (an :class:`Answer`) itself."""

    def match_or_add(self, item: Answer, text: str) -> Indexed | None: ...


@dataclass(slots=True)
class _Source:
    exact: dict[bytes, int] = field(default_factory=dict)  # digest → exact group number
    near: NearIndex | None = None  # this source's first answers (near matching on)


class Answer:
    """What a near index keeps of an indexed answer: an id (its exact group's number) and its
    source (the fields of a sample :class:`regen.sources.neardup.NearDuplicates` reads)."""

    __slots__ = ("id", "source")

    def __init__(self, id: str, source: str) -> None:
        self.id = id
        self.source = source


class CollapseFinder:
    """Feed every answer with :meth:`add` (rows in a deterministic order: the first answer of a
    near group leads it), then read :meth:`groups` and :meth:`rows`. ``near`` makes one near
    index per source (built for ``config.collapse_similarity``); None, or a similarity of 1.0,
    groups exact copies only."""

    def __init__(
        self,
        config: QualityConfig = DEFAULT_CONFIG,
        near: Callable[[], NearIndex] | None = None,
    ) -> None:
        self.min_words = config.collapse_min_words
        self.min_prompts = config.collapse_min_prompts
        self.similarity = config.collapse_similarity
        self._near = near if self.similarity < 1.0 else None
        self._sources: dict[str, _Source] = {}
        # per exact group: its source, leader (near group), first prompt, rows, words, example
        self._group_source: list[str] = []
        self._leader = array("q")
        self._first_prompt: list[tuple[str, int]] = []
        self._more_prompts: dict[int, set[tuple[str, int]]] = {}
        self._group_rows = array("q")
        self._words = array("q")
        self._example: list[str] = []
        # per row fed with enough words: its number and exact group
        self._rows = array("q")
        self._row_group = array("q")
        self.answers = 0  #: answers fed
        self.judged = 0  #: answers with at least min_words words

    def add(self, row: int, source: str, prompt: tuple[str, int], text: str) -> None:
        """One answer: its row number, source, :func:`prompt_key` and :func:`answer_text`."""
        self.answers += 1
        w = words(text)
        if len(w) < self.min_words:
            return
        self.judged += 1
        norm = " ".join(w)
        digest = hashlib.blake2b(norm.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        src = self._sources.get(source)
        if src is None:
            src = self._sources[source] = _Source()
        g = src.exact.get(digest)
        if g is None:
            g = len(self._leader)
            src.exact[digest] = g
            self._group_source.append(source)
            near = norm if len(w) <= NEAR_WORDS else " ".join(w[:NEAR_WORDS])
            self._leader.append(self._near_leader(src, g, source, near))
            self._first_prompt.append(prompt)
            self._group_rows.append(0)
            self._words.append(len(w))
            self._example.append(_shorten(text))
        elif prompt != self._first_prompt[g]:
            self._more_prompts.setdefault(g, set()).add(prompt)
        self._group_rows[g] += 1
        self._rows.append(row)
        self._row_group.append(g)

    def _near_leader(self, src: _Source, g: int, source: str, norm: str) -> int:
        """The exact group that leads ``g``'s near group (``g`` itself when it leads)."""
        if self._near is None:
            return g
        if src.near is None:
            src.near = self._near()
        match = src.near.match_or_add(Answer(str(g), source), norm)
        return g if match is None else int(match.id)

    def _clusters(self) -> dict[int, list[int]]:
        """Near group leader → its exact groups."""
        out: dict[int, list[int]] = {}
        for g, lead in enumerate(self._leader):
            out.setdefault(lead, []).append(g)
        return out

    def _prompts(self, members: list[int]) -> int:
        seen: set[tuple[str, int]] = set()
        for g in members:
            seen.add(self._first_prompt[g])
            seen |= self._more_prompts.get(g, set())
        return len(seen)

    def groups(self, min_prompts: int | None = None) -> list[CollapseGroup]:
        """The groups answering at least ``min_prompts`` distinct prompts (default: the
        config's ``collapse_min_prompts``), most prompts first."""
        least = self.min_prompts if min_prompts is None else min_prompts
        out = []
        for lead, members in self._clusters().items():
            if sum(self._group_rows[g] for g in members) < least:
                continue  # cannot answer that many prompts
            prompts = self._prompts(members)
            if prompts >= least:
                out.append(
                    CollapseGroup(
                        source=self._group_source[lead],
                        prompts=prompts,
                        rows=sum(self._group_rows[g] for g in members),
                        variants=len(members),
                        words=self._words[lead],
                        example=self._example[lead],
                    )
                )
        out.sort(key=lambda c: (-c.prompts, c.source, c.example))
        return out

    def largest(self) -> dict[str, int]:
        """Per source, the most distinct prompts one group answers (1: no answer shared)."""
        best: dict[str, int] = {}
        for lead, members in self._clusters().items():
            src = self._group_source[lead]
            best[src] = max(best.get(src, 0), self._prompts(members))
        return best

    def rows(self) -> set[int]:
        """The row numbers of every collapsed group's rows."""
        collapsed: set[int] = set()
        for members in self._clusters().values():
            if sum(self._group_rows[g] for g in members) < self.min_prompts:
                continue
            if self._prompts(members) >= self.min_prompts:
                collapsed.update(members)
        if not collapsed:
            return set()
        return {r for r, g in zip(self._rows, self._row_group, strict=True) if g in collapsed}


def _shorten(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= EXAMPLE_CHARS else one[: EXAMPLE_CHARS - 1] + "…"
