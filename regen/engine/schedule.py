"""Tail-aware order of the samples not yet dispatched: the longest expected first.

What it learns is saved as the run directory's schedule record
(:class:`regen.store.layout.ScheduleRecord`: ``{"version": 1, "sources": {name: {turns, tokens,
n, sx, sy, sxx, sxy}}}``), replaced atomically whenever the driver writes a part. The
per-source ``turns``/``tokens`` are also derived from the parts at start
(:meth:`LengthModel.from_done`: ``read_done`` sums them while building the done-set), and
those win; the file adds what the parts do not hold (how the source's original answers
predicted the target's). A missing or unreadable file only means
starting that part of the estimate from its prior.

Expected cost of a sample (in decode tokens, the server's unit of work)::

    turns × tokens_per_turn(source) × verbosity(source, original) + PREFILL_WEIGHT × prompt

- ``tokens_per_turn``: the source's mean completion tokens per regenerated turn, learned from
  completed samples, shrunk towards the mean of all sources (``PRIOR_TURNS`` pseudo-turns), that
  one towards ``DEFAULT_TOKENS_PER_TURN`` before anything completed.
- ``verbosity``: how long this sample's original answers are against its source's, raised to a
  learned power: ``exp(b × (log original_chars − mean log original_chars of the source))``.
  ``b`` is the least-squares slope of log completion tokens per turn on log original chars over
  the source's completed samples, shrunk towards ``PRIOR_SLOPE`` (``PRIOR_SAMPLES``
  pseudo-samples) and clipped to [0, ``MAX_SLOPE``]: a source whose original answers say nothing
  about the target's lengths drifts to b = 0 (then only turns, source and prompt size order it).
  Samples without an original answer get 1.
- Multi-turn chains run their turns one after another, so their cost is the critical path.

:class:`WorkQueue` orders the not-yet-dispatched samples on that cost (ties: input order).
They are columns (:class:`QueueItems`: source, turns, prompt size, original size as numpy
arrays), so the costs are computed for all of them at once and sorted in C (1.4M samples:
~0.3 s); a sample becomes an object only when it is popped. When an estimate moves by more than
``REPRIORITISE_SHIFT`` the remaining order is re-keyed (at most once per
``REPRIORITISE_EVERY_S`` and per ``REBUILD_DUTY`` × the last re-key's time). Samples taken
back from a dead worker are pushed on a small heap beside the sorted columns, with their cost.

Memory: a queued sample is a row of the columns, plus, when the plan read it from the sources,
a :class:`regen.plan.packed.PackedSample` (what ordering needs, readable) whose body, a pickle,
lives in a :class:`regen.plan.packed.Spill` file (an unlinked temporary file of the driver)
until it is dispatched, so a 1.4M-sample plan holds ~0.3 KB per queued sample in memory (0.28
KB measured by ``python -m benchmarks.queue_memory``). A plan from the plan index
(:mod:`regen.store.planned`) holds only the columns; bodies are read from the sources when
popped (:class:`regen.plan.packed.Bodies`)."""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from regen.core.sample import Sample
from regen.plan.packed import Bodies, PackedSample, QueueItem, QueueItems
from regen.store.doneset import DoneSet
from regen.store.layout import ScheduleRecord

log = logging.getLogger(__name__)

SCHEDULE_VERSION = 1

#: tokens per regenerated turn assumed before any sample completed
DEFAULT_TOKENS_PER_TURN = 512.0
#: pseudo-turns of the prior in each source's mean (shrinkage)
PRIOR_TURNS = 8.0
#: slope of log answer tokens on log original chars before a source taught anything
PRIOR_SLOPE = 0.5
#: pseudo-samples of that prior
PRIOR_SAMPLES = 16.0
#: the slope is clipped to [0, MAX_SLOPE]
MAX_SLOPE = 1.5
#: the verbosity factor is clipped to [1/MAX_VERBOSITY, MAX_VERBOSITY]
MAX_VERBOSITY = 64.0
#: decode-token cost of one prompt token (prefill is far cheaper than decode per token)
PREFILL_WEIGHT = 0.02
#: characters per prompt token assumed for the prompt-length term
CHARS_PER_TOKEN = 4.0
#: relative change of an estimate that triggers a rebuild of the heap
REPRIORITISE_SHIFT = 0.10
#: at most one rebuild per this many seconds
REPRIORITISE_EVERY_S = 2.0
#: ... and per this many times the last rebuild's duration (a 1.4M-sample heap takes seconds
#: to re-key: rebuilds then cost the driver at most ~1/REBUILD_DUTY of its time)
REBUILD_DUTY = 20.0


@dataclass(slots=True)
class SourceLengths:
    """What completed samples of one source taught: turns and tokens, and the sums of the
    regression of log tokens per turn (y) on log original chars (x) over samples with an
    original answer."""

    turns: int = 0
    tokens: float = 0.0
    n: int = 0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def slope(self) -> float:
        """Shrunk least-squares slope of y on x."""
        b_hat, weight = PRIOR_SLOPE, 0.0
        if self.n >= 2:
            var = self.n * self.sxx - self.sx * self.sx
            if var > 1e-9 * self.n * self.n:
                b_hat = (self.n * self.sxy - self.sx * self.sy) / var
                weight = float(self.n)
        b = (weight * b_hat + PRIOR_SAMPLES * PRIOR_SLOPE) / (weight + PRIOR_SAMPLES)
        return min(MAX_SLOPE, max(0.0, b))


class LengthModel:
    """Per-source expected output tokens per turn, learned from completed samples."""

    def __init__(self, stats: dict[str, SourceLengths] | None = None) -> None:
        self.sources: dict[str, SourceLengths] = dict(stats or {})
        #: (count, Σ log original chars) of the queued samples per source (see WorkQueue)
        self.queued: dict[str, tuple[int, float]] = {}
        self._cache: dict[str, tuple[float, float, float | None]] = {}

    # -- learning -------------------------------------------------------------------------
    def observe(
        self, source: str, completion_tokens: Iterable[int], original_chars: int = 0
    ) -> None:
        """One completed sample: the completion tokens of each regenerated turn, and the mean
        characters of its original answers (0: none)."""
        st = self.sources.setdefault(source, SourceLengths())
        turns, tokens = 0, 0.0
        for ct in completion_tokens:
            turns += 1
            tokens += float(ct)
        st.turns += turns
        st.tokens += tokens
        if original_chars > 0 and turns:
            x, y = math.log(original_chars), math.log(1.0 + tokens / turns)
            st.n += 1
            st.sx += x
            st.sy += y
            st.sxx += x * x
            st.sxy += x * y
        self._cache.clear()

    def set_queued(self, samples: Iterable[Sample | PackedSample] | QueueItems) -> None:
        """Count the original answer sizes of the samples still queued: with the completed
        ones they give each source's centre (its typical original answer size)."""
        items = samples if isinstance(samples, QueueItems) else QueueItems.of(samples)
        queued: dict[str, tuple[int, float]] = {}
        has = items.original > 0
        if has.any():
            k = len(items.names)
            src = items.source[has]
            n = np.bincount(src, minlength=k)
            sx = np.bincount(src, weights=np.log(items.original[has].astype(np.float64)),
                             minlength=k)  # fmt: skip
            for code, name in enumerate(items.names):
                if n[code]:
                    queued[name] = (int(n[code]), float(sx[code]))
        self.queued = queued
        self._cache.clear()

    # -- estimates ------------------------------------------------------------------------
    def global_mean(self) -> float:
        turns = sum(s.turns for s in self.sources.values())
        tokens = sum(s.tokens for s in self.sources.values())
        return (tokens + PRIOR_TURNS * DEFAULT_TOKENS_PER_TURN) / (turns + PRIOR_TURNS)

    def tokens_per_turn(self, source: str) -> float:
        return self._params(source)[0]

    def slope(self, source: str) -> float:
        return self._params(source)[1]

    def _params(self, source: str) -> tuple[float, float, float | None]:
        """(tokens per turn, slope, centre of log original chars) of a source, cached until
        the next observation."""
        got = self._cache.get(source)
        if got is not None:
            return got
        prior = self.global_mean()
        st = self.sources.get(source) or SourceLengths()
        mean = (st.tokens + PRIOR_TURNS * prior) / (st.turns + PRIOR_TURNS)
        qn, qx = self.queued.get(source, (0, 0.0))
        n, sx = st.n + qn, st.sx + qx
        got = (mean, st.slope(), sx / n if n else None)
        self._cache[source] = got
        return got

    def verbosity(self, source: str, original_chars: int) -> float:
        """How much longer than its source's typical answer this sample's is expected to be."""
        if original_chars <= 0:
            return 1.0
        _, b, centre = self._params(source)
        if centre is None or b == 0.0:
            return 1.0
        f = math.exp(b * (math.log(original_chars) - centre))
        return min(MAX_VERBOSITY, max(1.0 / MAX_VERBOSITY, f))

    def cost(self, sample: Sample | PackedSample) -> float:
        """Expected decode tokens on the sample's critical path."""
        per_turn = self.tokens_per_turn(sample.source)
        per_turn *= self.verbosity(sample.source, sample.original_chars())
        return sample.turns_to_regenerate() * per_turn + PREFILL_WEIGHT * prompt_tokens(sample)

    def costs(self, items: QueueItems, which: np.ndarray | None = None) -> np.ndarray:
        """:meth:`cost` of the items ``which`` (default all) at once (float64 array)."""
        src = items.source if which is None else items.source[which]
        turns = items.turns if which is None else items.turns[which]
        chars = items.chars if which is None else items.chars[which]
        orig = items.original if which is None else items.original[which]
        params = [self._params(name) for name in items.names]
        mean = np.array([p[0] for p in params], dtype=np.float64)
        slope = np.array([p[1] for p in params], dtype=np.float64)
        centre = np.array([np.nan if p[2] is None else p[2] for p in params], dtype=np.float64)
        verbosity = np.ones(len(src), dtype=np.float64)
        b, c = slope[src], centre[src]
        use = (orig > 0) & (b != 0.0) & ~np.isnan(c)
        if use.any():
            x = np.log(orig[use].astype(np.float64))
            f = np.exp(b[use] * (x - c[use]))
            verbosity[use] = np.clip(f, 1.0 / MAX_VERBOSITY, MAX_VERBOSITY)
        per_turn = mean[src] * verbosity
        return turns * per_turn + PREFILL_WEIGHT * (chars / CHARS_PER_TOKEN)

    # -- persistence ----------------------------------------------------------------------
    def state(self) -> dict[str, object]:
        """The learned state as plain data (the schedule record's shape)."""
        return {
            "version": SCHEDULE_VERSION,
            "sources": {k: dataclasses.asdict(v) for k, v in self.sources.items()},
        }

    @classmethod
    def from_done(
        cls,
        done: DoneSet,
        regenerate: Iterable[str],
        state: ScheduleRecord | dict[str, Any] | None = None,
    ) -> LengthModel:
        """Learned state of earlier sessions: per-source turns and tokens from a
        :class:`regen.store.doneset.DoneSet` (only sources that regenerate: native rows say
        nothing about the server), the regression sums from the saved schedule record."""
        keep = set(regenerate)
        if isinstance(state, ScheduleRecord):
            state = state.model_dump()
        saved = _saved_sources(state)
        out: dict[str, SourceLengths] = {}
        for name in keep:
            t = done.sources.get(name)
            st = saved.get(name) or SourceLengths()
            if t is not None and t.rows > 0:
                st.turns, st.tokens = int(t.rows), float(t.completion_tokens)
            else:
                st.turns, st.tokens = 0, 0.0
            if st.turns or st.n:
                out[name] = st
        return cls(out)


def _saved_sources(state: dict[str, Any] | None) -> dict[str, SourceLengths]:
    if not state:
        return {}
    try:
        if state.get("version") != SCHEDULE_VERSION:
            raise ValueError(f"version {state.get('version')!r}")
        fields = {f.name for f in dataclasses.fields(SourceLengths)}
        out = {}
        for name, d in dict(state["sources"]).items():
            if set(d) != fields:
                raise ValueError(f"source {name!r}: fields {sorted(d)}")
            st = SourceLengths(int(d["turns"]), float(d["tokens"]), int(d["n"]),
                             *(float(d[k]) for k in ("sx", "sy", "sxx", "sxy")))  # fmt: skip
            if not all(math.isfinite(v) for v in (st.sx, st.sy, st.sxx, st.sxy)):
                raise ValueError(f"source {name!r}: not finite")
            out[str(name)] = st
        return out
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        log.warning("the saved schedule is ignored (%s): the length estimate starts from its "
                    "prior", e)  # fmt: skip
        return {}


def schedule_record(model: LengthModel) -> ScheduleRecord:
    """What the run directory keeps of ``model``."""
    return ScheduleRecord.model_validate(model.state())


def prompt_tokens(sample: Sample | PackedSample) -> float:
    return sample.prompt_chars() / CHARS_PER_TOKEN


class WorkQueue:
    """The not-yet-dispatched samples, most expensive first; re-keyed as estimates move.
    Popped samples come with their body loaded from ``spill`` (when they were spilled)."""

    def __init__(
        self,
        samples: Iterable[QueueItem] | QueueItems,
        model: LengthModel | None = None,
        *,
        spill: Bodies | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model or LengthModel()
        self.spill = spill
        self._clock = clock
        items = samples if isinstance(samples, QueueItems) else QueueItems.of(samples)
        self._items = items
        self.model.set_queued(items)
        self._keys = self.model.costs(items)
        #: item indexes not yet popped, most expensive first (ties: input order), from _pos on
        self._order = np.argsort(-self._keys, kind="stable")
        self._pos = 0
        #: pushed samples (taken back from a dead worker): (-cost, seq, sample)
        self._heap: list[tuple[float, int, QueueItem]] = []
        self._seq = len(items)
        self._keyed_at = self._snapshot_estimates()
        self._last_rebuild = clock()
        self._rebuild_gap = REPRIORITISE_EVERY_S
        self.rebuilds = 0

    def __len__(self) -> int:
        return len(self._order) - self._pos + len(self._heap)

    def pop(self) -> QueueItem | None:
        """The most expensive sample left (body loaded), or None."""
        s: QueueItem
        if self._pos < len(self._order):
            i = int(self._order[self._pos])
            if self._heap and self._heap[0][:2] < (-float(self._keys[i]), i):
                s = heapq.heappop(self._heap)[2]
            else:
                self._pos += 1
                s = self._items.item(i)
        elif self._heap:
            s = heapq.heappop(self._heap)[2]
        else:
            return None
        return s.loaded(self.spill) if isinstance(s, PackedSample) else s

    def push(self, sample: QueueItem) -> None:
        """Put a sample (back) in the queue, e.g. one taken from a dead worker."""
        heapq.heappush(self._heap, (-self.model.cost(sample), self._seq, sample))
        self._seq += 1

    def observe(
        self, source: str, completion_tokens: Iterable[int], original_chars: int = 0
    ) -> None:
        """Learn from a completed sample; re-key the order when estimates moved enough."""
        self.model.observe(source, completion_tokens, original_chars)
        self.maybe_reprioritise()

    def maybe_reprioritise(self, *, force: bool = False) -> bool:
        now = self._clock()
        if not force and now - self._last_rebuild < self._rebuild_gap:
            return False
        current = self._snapshot_estimates()
        moved = any(_moved(self._keyed_at.get(k), v) for k, v in current.items())
        if not (moved or force):
            return False
        left = np.sort(self._order[self._pos :])  # input order: ties stay in it
        keys = np.zeros(len(self._items), dtype=np.float64)
        keys[left] = self.model.costs(self._items, left)
        self._keys = keys
        self._order = left[np.argsort(-keys[left], kind="stable")]
        self._pos = 0
        self._heap = [(-self.model.cost(s), seq, s) for _, seq, s in self._heap]
        heapq.heapify(self._heap)
        self._keyed_at = current
        self._last_rebuild = self._clock()
        self._rebuild_gap = max(REPRIORITISE_EVERY_S, REBUILD_DUTY * (self._last_rebuild - now))
        self.rebuilds += 1
        log.debug("dispatch order re-keyed (%d queued, next in >= %.1f s)", len(self),
                  self._rebuild_gap)  # fmt: skip
        return True

    def _snapshot_estimates(self) -> dict[str, tuple[float, float]]:
        out = {n: (self.model.tokens_per_turn(n), self.model.slope(n)) for n in self.model.sources}
        out["*"] = (self.model.global_mean(), PRIOR_SLOPE)
        return out


def _moved(old: tuple[float, float] | None, new: tuple[float, float]) -> bool:
    """An estimate moved enough to re-key: its mean by > REPRIORITISE_SHIFT, or its slope by
    more than REPRIORITISE_SHIFT (absolute)."""
    mean0, b0 = old if old is not None else (DEFAULT_TOKENS_PER_TURN, PRIOR_SLOPE)
    return (
        abs(new[0] - mean0) > REPRIORITISE_SHIFT * max(1.0, mean0)
        or abs(new[1] - b0) > REPRIORITISE_SHIFT
    )
