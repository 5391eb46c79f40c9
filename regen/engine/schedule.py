"""Tail-aware order of the samples not yet dispatched: the longest expected first.

Owns no files. What it learns survives a resume because it is derived from the run
directory's parts at start (:meth:`LengthModel.from_done`: the per-source ``rows`` and
``completion_tokens`` that :func:`regen.store.journal.read_done` already sums while building
the done-set), so the first dispatches of a resumed session are ordered by what earlier
sessions saw, at no extra reading cost, and it can never disagree with the data.

Expected cost of a sample (in decode tokens, the server's unit of work):
``turns × mean_output_tokens_per_turn(source) + PREFILL_WEIGHT × prompt_tokens``.
The per-source mean is shrunk towards the mean of all sources (``PRIOR_TURNS`` pseudo-turns),
and that one towards ``DEFAULT_TOKENS_PER_TURN`` before anything completed. Multi-turn chains
run their turns one after another, so their cost is the critical path, not only the load.

:class:`WorkQueue` is a heap of the not-yet-dispatched samples keyed on that cost (ties: input
order). When an estimate moves by more than ``REPRIORITISE_SHIFT`` the heap is rebuilt
(O(n), at most once per ``REPRIORITISE_EVERY_S``). Samples taken back from a dead worker are
pushed again with their cost.
"""

from __future__ import annotations

import heapq
import logging
import pickle
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from regen.sample import Sample

log = logging.getLogger(__name__)

#: tokens per regenerated turn assumed before any sample completed
DEFAULT_TOKENS_PER_TURN = 512.0
#: pseudo-turns of the prior in each source's mean (shrinkage)
PRIOR_TURNS = 8.0
#: decode-token cost of one prompt token (prefill is far cheaper than decode per token)
PREFILL_WEIGHT = 0.02
#: characters per prompt token assumed for the prompt-length term
CHARS_PER_TOKEN = 4.0
#: relative change of an estimate that triggers a rebuild of the heap
REPRIORITISE_SHIFT = 0.10
#: at most one rebuild per this many seconds
REPRIORITISE_EVERY_S = 2.0


@dataclass(slots=True)
class SourceStats:
    """Completed regenerated turns of one source and their completion tokens."""

    turns: int = 0
    tokens: float = 0.0


class LengthModel:
    """Per-source mean output tokens per turn, learned from completed samples."""

    def __init__(self, stats: dict[str, SourceStats] | None = None) -> None:
        self.sources: dict[str, SourceStats] = dict(stats or {})

    def observe(self, source: str, completion_tokens: Iterable[int]) -> None:
        """One completed sample: the completion tokens of each of its regenerated turns."""
        st = self.sources.setdefault(source, SourceStats())
        for ct in completion_tokens:
            st.turns += 1
            st.tokens += float(ct)

    def global_mean(self) -> float:
        turns = sum(s.turns for s in self.sources.values())
        tokens = sum(s.tokens for s in self.sources.values())
        return (tokens + PRIOR_TURNS * DEFAULT_TOKENS_PER_TURN) / (turns + PRIOR_TURNS)

    def tokens_per_turn(self, source: str) -> float:
        prior = self.global_mean()
        st = self.sources.get(source)
        if st is None:
            return prior
        return (st.tokens + PRIOR_TURNS * prior) / (st.turns + PRIOR_TURNS)

    def cost(self, sample: Sample | PackedSample) -> float:
        """Expected decode tokens on the sample's critical path."""
        return sample_cost(sample, self.tokens_per_turn(sample.source))

    @classmethod
    def from_done(cls, done: Any, regenerate: Iterable[str]) -> LengthModel:
        """Learned state of earlier sessions, from a :class:`regen.store.journal.DoneSet`
        (only sources that regenerate: native rows say nothing about the server)."""
        keep = set(regenerate)
        return cls(
            {
                name: SourceStats(int(t.rows), float(t.completion_tokens))
                for name, t in done.sources.items()
                if name in keep and t.rows > 0
            }
        )


PICKLE_PROTOCOL = 5
_ZDICT: list[bytes] = []


def _zdict() -> bytes:
    """A preset zlib dictionary: the pickle of a small sample (class paths, field layout,
    common words), so each blob does not repeat them (~25% smaller). Built the same way in
    the driver and the actors (same code)."""
    if not _ZDICT:
        from regen.sample import Message

        dummy = Sample("source:0123456789abcdef", "source", [
            Message("system", "You are a helpful assistant."),
            Message("user", "the of and to in is that it for as with was on be by this are"),
            Message("assistant", "the of and to in is that it for as"),
        ])  # fmt: skip
        _ZDICT.append(pickle.dumps(dummy, protocol=PICKLE_PROTOCOL))
    return _ZDICT[0]


@dataclass(slots=True, frozen=True)
class PackedSample:
    """A sample waiting in the queue, compressed (a 1.4M-sample plan must fit in memory): what
    ordering needs stays readable (id, source, turns, prompt size), the rest is a zlib'd
    pickle that the worker unpacks. Duck-types the parts of :class:`Sample` the cost uses."""

    id: str
    source: str
    turns: int
    chars: int
    blob: bytes

    @classmethod
    def pack(cls, sample: Sample) -> PackedSample:
        z = zlib.compressobj(1, zdict=_zdict())
        blob = z.compress(pickle.dumps(sample, protocol=PICKLE_PROTOCOL)) + z.flush()
        return cls(sample.id, sample.source, sample.turns_to_regenerate(),
                   sample.prompt_chars(), blob)  # fmt: skip

    def unpack(self) -> Sample:
        z = zlib.decompressobj(zdict=_zdict())
        sample: Sample = pickle.loads(z.decompress(self.blob) + z.flush())
        return sample

    def turns_to_regenerate(self) -> int:
        return self.turns

    def prompt_chars(self) -> int:
        return self.chars


def unpacked(sample: Sample | PackedSample) -> Sample:
    return sample.unpack() if isinstance(sample, PackedSample) else sample


def prompt_tokens(sample: Sample | PackedSample) -> float:
    return sample.prompt_chars() / CHARS_PER_TOKEN


def sample_cost(sample: Sample | PackedSample, tokens_per_turn: float) -> float:
    return sample.turns_to_regenerate() * tokens_per_turn + PREFILL_WEIGHT * prompt_tokens(sample)


class WorkQueue:
    """The not-yet-dispatched samples, most expensive first; re-keyed as estimates move."""

    def __init__(
        self,
        samples: Iterable[Sample | PackedSample],
        model: LengthModel | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model or LengthModel()
        self._clock = clock
        self._seq = 0
        self._heap: list[tuple[float, int, Sample | PackedSample]] = []
        for s in samples:
            self._heap.append((-self.model.cost(s), self._seq, s))
            self._seq += 1
        heapq.heapify(self._heap)
        self._keyed_at = self._snapshot_estimates()
        self._last_rebuild = clock()
        self.rebuilds = 0

    def __len__(self) -> int:
        return len(self._heap)

    def pop(self) -> Sample | PackedSample | None:
        """The most expensive sample left, or None."""
        if not self._heap:
            return None
        return heapq.heappop(self._heap)[2]

    def push(self, sample: Sample | PackedSample) -> None:
        """Put a sample (back) in the queue, e.g. one taken from a dead worker."""
        heapq.heappush(self._heap, (-self.model.cost(sample), self._seq, sample))
        self._seq += 1

    def observe(self, source: str, completion_tokens: Iterable[int]) -> None:
        """Learn from a completed sample; rebuild the heap when estimates moved enough."""
        self.model.observe(source, completion_tokens)
        self.maybe_reprioritise()

    def maybe_reprioritise(self, *, force: bool = False) -> bool:
        now = self._clock()
        if not force and now - self._last_rebuild < REPRIORITISE_EVERY_S:
            return False
        current = self._snapshot_estimates()
        moved = any(
            abs(v - self._keyed_at.get(k, DEFAULT_TOKENS_PER_TURN))
            > REPRIORITISE_SHIFT * max(1.0, self._keyed_at.get(k, DEFAULT_TOKENS_PER_TURN))
            for k, v in current.items()
        )
        if not (moved or force):
            return False
        self._heap = [(-self.model.cost(s), seq, s) for _, seq, s in self._heap]
        heapq.heapify(self._heap)
        self._keyed_at = current
        self._last_rebuild = now
        self.rebuilds += 1
        return True

    def _snapshot_estimates(self) -> dict[str, float]:
        names = set(self.model.sources)
        out = {n: self.model.tokens_per_turn(n) for n in names}
        out["*"] = self.model.global_mean()
        return out
