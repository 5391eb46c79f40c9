"""Near-duplicate prompts: MinHash signatures of word shingles and a compact LSH index.

What is compared (:func:`near_text`): the text a sample's requests send unchanged, less its
system prompts — every ``user`` and ``tool`` message and, for ``turns: last``, the assistant
turns before the last one — plus the names of the declared tools. System prompts are left out on
purpose: a changed system prompt is one of the near-duplicates this finds, and one shared system
prompt (OpenThoughts puts the same long one on every row) would otherwise make unrelated short
questions look alike. Native (pre-tokenized) samples are not compared.

Words are :func:`regen.core.text.words` (NFKC, case folded, punctuation dropped, each CJK character
a word of its own). Shingles are ``dedup.shingle``
consecutive words (a text with fewer words is one shingle); a text with no word is left to the
exact dedup.

Signatures come from rensa's ``RMinHash`` (``dedup.num_perm`` values, seed :data:`SEED`). The
index bands them (``bands`` × ``rows``, see :func:`lsh_params`), keeps one 64-bit key per band in
sorted numpy runs, and verifies every candidate on a stored 8-bit signature (the low byte of each
MinHash value): a sample is a near-duplicate when its estimated Jaccard similarity with an
indexed one is at least ``dedup.threshold``. Only kept samples are indexed, so the first
occurrence in manifest order wins and a dropped sample never causes a later drop.

Memory per indexed sample: ``bands`` × 12 bytes of index + ``num_perm`` bytes of signature + its
id and source (about 30 bytes): about 330 bytes per kept sample at the defaults (14 bands, 128
permutations). Merges of sorted runs stop at :data:`RUN_CAP` keys, so a merge needs at most
~100 MB more. Measured for 1.4M synthetic prompts (8% of them near-duplicates): 400 MiB of state,
466 MiB peak RSS (benchmarks/neardup.py; docs/performance.md).
Owns no files.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import rensa

from regen.core.sample import Sample
from regen.core.text import words
from regen.manifest import Dedup

#: MinHash seed (part of the algorithm: changing it changes which near-duplicates are found)
SEED = 1
#: recall the LSH banding must reach at exactly the threshold (higher above it)
BAND_RECALL = 0.95
#: samples whose band keys wait in a dict before they become a sorted run
PENDING_SAMPLES = 8192
#: band keys beyond which two sorted runs are not merged (what a merge needs stays bounded)
RUN_CAP = 1 << 22
#: rows per chunk of the stored 8-bit signatures
SIG_CHUNK = 65536
#: examples kept per (source, duplicate-of source) pair
EXAMPLES_PER_PAIR = 3
#: characters of a dropped prompt shown with an example
EXAMPLE_CHARS = 160

#: the last key of every sorted run (band keys are made below it)
_SENTINEL = np.uint64(2**64 - 1)


def near_text(sample: Sample) -> str:
    """The part of a sample that near-duplicate detection compares (module docstring)."""
    msgs = sample.messages
    last_answer = max((i for i, m in enumerate(msgs) if m.role == "assistant"), default=-1)
    parts: list[str] = []
    for i, m in enumerate(msgs):
        if m.role in ("user", "tool"):
            parts.append(m.content)
        elif m.role == "assistant" and sample.turns == "last" and i < last_answer:
            parts.append(m.content)
            parts.extend(f"{c.name} {c.arguments}" for c in m.tool_calls)
    names = [
        str(t.get("function", {}).get("name", ""))
        for t in sample.tools or ()
        if isinstance(t, dict)
    ]
    if any(names):
        parts.append("tools " + " ".join(sorted(n for n in names if n)))
    return "\n".join(parts)


def shingles(text: str, k: int) -> list[str]:
    """Word ``k``-grams of ``text`` (one shingle when it has fewer than ``k`` words)."""
    w = words(text)
    if len(w) <= k:
        return [" ".join(w)] if w else []
    return [" ".join(w[i : i + k]) for i in range(len(w) - k + 1)]


def expected_recall(similarity: float, bands: int, rows: int) -> float:
    """Chance that a pair at ``similarity`` becomes a candidate (the LSH S-curve)."""
    return 1.0 - (1.0 - similarity**rows) ** bands


def lsh_params(threshold: float, num_perm: int, recall: float = BAND_RECALL) -> tuple[int, int]:
    """``(bands, rows)``: the most rows per band whose chance of making a pair at exactly
    ``threshold`` similarity a candidate (:func:`expected_recall`) is at least ``recall``
    (fewer, longer bands mean fewer false candidates and a smaller index)."""
    for rows in range(num_perm, 0, -1):
        bands = num_perm // rows
        if expected_recall(threshold, bands, rows) >= recall:
            return bands, rows
    return num_perm, 1


class Keyed(Protocol):
    """What the index keeps of an item it indexes (a :class:`Sample`, or another record)."""

    @property
    def id(self) -> str: ...

    @property
    def source(self) -> str: ...


@dataclass(slots=True, frozen=True)
class NearMatch:
    """The indexed sample a new one duplicates."""

    id: str  #: id of the kept sample
    source: str  #: its source
    similarity: float  #: estimated Jaccard similarity of the two prompts' shingles


@dataclass(slots=True)
class NearReport:
    """Near-duplicates dropped, per (source, duplicate-of source) pair, with a few examples."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    examples: dict[tuple[str, str], list[dict[str, object]]] = field(default_factory=dict)

    def add(self, sample: Sample, match: NearMatch, text: str) -> None:
        pair = (sample.source, match.source)
        self.counts[pair] = self.counts.get(pair, 0) + 1
        shown = self.examples.setdefault(pair, [])
        if len(shown) < EXAMPLES_PER_PAIR:
            snippet = " ".join(text.split())
            if len(snippet) > EXAMPLE_CHARS:
                snippet = snippet[: EXAMPLE_CHARS - 1] + "…"
            shown.append(
                {
                    "id": sample.id,
                    "duplicate_of": match.id,
                    "similarity": round(match.similarity, 3),
                    "prompt": snippet,
                }
            )

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_dict(self, order: Iterable[str]) -> list[dict[str, object]]:
        """The pairs in manifest ``order`` (dropped source, then duplicate-of source)."""
        rank = {name: i for i, name in enumerate(order)}
        far = len(rank)
        pairs = sorted(self.counts, key=lambda p: (rank.get(p[0], far), rank.get(p[1], far), p))
        return [
            {
                "source": a,
                "duplicate_of": b,
                "count": self.counts[(a, b)],
                "examples": list(self.examples.get((a, b), [])),
            }
            for a, b in pairs
        ]


class _BandIndex:
    """Band key → indexed sample numbers: the recent keys in a dict, the rest in sorted numpy
    runs (merged while a run is at most twice the size of the next: O(log n) runs)."""

    def __init__(self) -> None:
        self._pending: dict[int, int] = {}  # key → first sample number with it
        self._repeats: list[tuple[int, int]] = []  # (key, number) of later pending repeats
        self._keys: list[int] = []  # pending keys and numbers, flat, for the next run
        self._ids: list[int] = []
        self._pending_samples = 0
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []  # (sorted uint64 keys, uint32 ids)

    def add(self, keys: list[int], n: int) -> None:
        pending = self._pending
        for k in keys:
            if pending.setdefault(k, n) != n:
                self._repeats.append((k, n))
        self._keys.extend(keys)
        self._ids.extend([n] * len(keys))
        self._pending_samples += 1
        if self._pending_samples >= PENDING_SAMPLES:
            self._flush()

    def candidates(self, keys: list[int], keys_np: np.ndarray) -> set[int]:
        pending = self._pending
        found = {pending[k] for k in keys if k in pending}
        if found and self._repeats:
            wanted = set(keys)
            found.update(n for k, n in self._repeats if k in wanted)
        for rk, ri in self._runs:  # each run ends with a sentinel key above every real one
            pos = np.searchsorted(rk, keys_np)
            hits = rk[pos] == keys_np
            if hits.any():
                for p in np.flatnonzero(hits).tolist():
                    a = b = int(pos[p])
                    while rk[b] == keys_np[p]:  # equal keys sit side by side
                        b += 1
                    found.update(ri[a:b].tolist())
        return found

    def nbytes(self) -> int:
        return sum(k.nbytes + i.nbytes for k, i in self._runs)

    def _flush(self) -> None:
        if not self._keys:
            return
        keys = np.array(self._keys, dtype=np.uint64)
        ids = np.array(self._ids, dtype=np.uint32)
        self._pending, self._repeats, self._keys, self._ids = {}, [], [], []
        self._pending_samples = 0
        order = np.argsort(keys, kind="stable")
        self._runs.append((np.append(keys[order], _SENTINEL), np.append(ids[order], np.uint32(0))))
        while len(self._runs) >= 2:
            (k1, i1), (k2, i2) = self._runs[-2], self._runs[-1]
            if len(k1) > 2 * len(k2) or len(k1) + len(k2) > RUN_CAP:
                break
            self._runs[-2:] = [_merge(k1, i1, k2, i2)]


def _merge(
    k1: np.ndarray, i1: np.ndarray, k2: np.ndarray, i2: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Two sorted runs (each ending with the sentinel) as one; on equal keys the older run's
    entries come first. Needs the output plus one index per entry of the newer run."""
    a, b = k1[:-1], k2[:-1]
    n = len(a) + len(b)
    at = np.searchsorted(a, b, side="right") + np.arange(len(b))  # b's places in the output
    from_a = np.ones(n, dtype=bool)
    from_a[at] = False
    keys = np.empty(n + 1, dtype=np.uint64)
    ids = np.empty(n + 1, dtype=np.uint32)
    keys[:n][from_a], keys[at], keys[n] = a, b, _SENTINEL
    ids[:n][from_a], ids[at], ids[n] = i1[:-1], i2[:-1], 0
    return keys, ids


class NearDuplicates:
    """Streaming near-duplicate detection: :meth:`match_or_add` each sample in order."""

    def __init__(self, dedup: Dedup) -> None:
        self.threshold = dedup.threshold
        self.shingle = dedup.shingle
        self.num_perm = dedup.num_perm
        self.bands, self.rows = lsh_params(dedup.threshold, dedup.num_perm)
        rng = np.random.default_rng(SEED)
        # odd 64-bit multipliers and one salt per band: a band key is sum(value * mult) ^ salt
        self._mult = (rng.integers(0, 2**63, size=self.rows, dtype=np.uint64) << 1) | 1
        self._salt = rng.integers(0, 2**63, size=self.bands, dtype=np.uint64)
        self._index = _BandIndex()
        self._sigs: list[np.ndarray] = []
        self._ids = bytearray()
        self._id_ends = array("Q")
        self._sources: list[str] = []  # source names by number
        self._source_no: dict[str, int] = {}
        self._source_of = array("H")
        self.count = 0  #: samples indexed

    def match_or_add(self, sample: Keyed, text: str | None = None) -> NearMatch | None:
        """The indexed sample ``sample`` near-duplicates (best match, earliest on a tie), or
        None after indexing ``sample`` itself. Samples with no words are neither. ``text``: what
        is compared (default: :func:`near_text`, of a :class:`Sample`)."""
        if text is None:
            if not isinstance(sample, Sample):
                raise TypeError(f"the text of a {type(sample).__name__} must be given")
            text = near_text(sample)
        sh = shingles(text, self.shingle)
        if not sh:
            return None
        mh = rensa.RMinHash(self.num_perm, SEED)
        mh.update(sh)
        digest = np.asarray(mh.digest(), dtype=np.uint32)
        bands = digest[: self.bands * self.rows].reshape(self.bands, self.rows).astype(np.uint64)
        keys_np = np.minimum((bands * self._mult).sum(axis=1, dtype=np.uint64) ^ self._salt,
                             _SENTINEL - np.uint64(1))  # fmt: skip
        keys = keys_np.tolist()
        sig = (digest & 0xFF).astype(np.uint8)
        best: tuple[float, int] | None = None
        for n in sorted(self._index.candidates(keys, keys_np)):
            sim = self._similarity(sig, n)
            if sim >= self.threshold and (best is None or sim > best[0]):
                best = (sim, n)
        if best is not None:
            sim, n = best
            return NearMatch(self._id(n), self._sources[self._source_of[n]], sim)
        self._add(sample, keys, sig)
        return None

    def nbytes(self) -> int:
        """Bytes held by the index, signatures and ids (Python object overhead aside)."""
        sigs = len(self._sigs) * SIG_CHUNK * self.num_perm
        ids = len(self._ids) + self._id_ends.itemsize * len(self._id_ends)
        return self._index.nbytes() + sigs + ids + 2 * len(self._source_of)

    def _similarity(self, sig: np.ndarray, n: int) -> float:
        stored = self._sigs[n // SIG_CHUNK][n % SIG_CHUNK]
        equal = int(np.count_nonzero(stored == sig)) / self.num_perm
        # two different values share their low byte with chance 1/256: undo that share
        return max(0.0, (equal - 1 / 256) / (1 - 1 / 256))

    def _id(self, n: int) -> str:
        start = self._id_ends[n - 1] if n else 0
        return self._ids[start : self._id_ends[n]].decode("utf-8")

    def _add(self, sample: Keyed, keys: list[int], sig: np.ndarray) -> None:
        n = self.count
        if n % SIG_CHUNK == 0:
            self._sigs.append(np.zeros((SIG_CHUNK, self.num_perm), dtype=np.uint8))
        self._sigs[-1][n % SIG_CHUNK] = sig
        self._ids += sample.id.encode("utf-8")
        self._id_ends.append(len(self._ids))
        if sample.source not in self._source_no:
            self._source_no[sample.source] = len(self._sources)
            self._sources.append(sample.source)
        self._source_of.append(self._source_no[sample.source])
        self._index.add(keys, n)
        self.count += 1
