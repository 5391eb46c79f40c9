"""Packed samples: the forms a sample takes while it waits to be sent. Owns no files.

- :class:`PackedSample`: a sample waiting in the queue: what ordering needs stays readable
  (id, source, turns, prompt size, original answer size); the rest is a pickle, in memory
  (``blob``) or in a body store (:class:`Bodies`) until :meth:`PackedSample.loaded`. It is
  also what the driver sends an actor (regen.engine.wire), which unpacks it
  (:func:`unpacked`).
- :class:`Spill`: append-only blobs in an unlinked temporary file of the driver (``$TMPDIR``,
  not the run directory): the bodies of a plan read from the sources.
- :class:`QueueItems`: samples as columns (numpy arrays of source, turns, prompt and original
  sizes) with the i-th sample made on demand: what the dispatch order
  (regen.engine.schedule) sorts, and what the plan index (regen.store.planned) yields.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from regen.core.sample import Sample

PICKLE_PROTOCOL = 5


class Bodies(Protocol):
    """Where queued samples' bodies wait: ``get(at, size)`` returns the pickle of the body a
    :class:`PackedSample` points at (a :class:`Spill`, or the plan index's sources)."""

    def get(self, at: int, size: int) -> bytes: ...


class Spill:
    """Append-only blobs in an unlinked temporary file (``$TMPDIR``): the bodies of the queued
    samples, read back one at a time when dispatched. Closed with the session."""

    def __init__(self, directory: str | None = None) -> None:
        self._file = tempfile.TemporaryFile(prefix="regen-queue-", dir=directory)  # noqa: SIM115 (closed by close())
        self._fd = self._file.fileno()
        self.size = 0

    def put(self, blob: bytes) -> int:
        at = self.size
        self._file.write(blob)
        self.size += len(blob)
        return at

    def get(self, at: int, size: int) -> bytes:
        self._file.flush()
        return os.pread(self._fd, size, at)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Spill:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(slots=True, frozen=True)
class PackedSample:
    """A sample waiting in the queue: what ordering needs stays readable (id, source, turns,
    prompt size, original answer size); the rest is a pickle, in memory
    (``blob``) or in a body store (:class:`Bodies`: ``at`` ≥ 0, ``size`` bytes) until
    :meth:`loaded`. Duck-types the parts of :class:`Sample` the cost uses."""

    id: str
    source: str
    turns: int
    chars: int
    original: int
    blob: bytes = b""
    at: int = -1
    size: int = 0

    @classmethod
    def pack(cls, sample: Sample, spill: Spill | None = None) -> PackedSample:
        blob = pickle.dumps(sample, protocol=PICKLE_PROTOCOL)
        head = (sample.id, sample.source, sample.turns_to_regenerate(), sample.prompt_chars(),
                sample.original_chars())  # fmt: skip
        if spill is None:
            return cls(*head, blob=blob)
        return cls(*head, at=spill.put(blob), size=len(blob))

    def loaded(self, spill: Bodies | None) -> PackedSample:
        """The same sample with its body in memory (what is sent to a worker)."""
        if self.at < 0:
            return self
        if spill is None:
            raise ValueError(f"{self.id}: body is in a spill file and none was given")
        return dataclasses.replace(self, blob=spill.get(self.at, self.size), at=-1, size=0)

    def unpack(self) -> Sample:
        if self.at >= 0:
            raise ValueError(f"{self.id}: body is still in the spill file")
        sample: Sample = pickle.loads(self.blob)
        return sample

    def turns_to_regenerate(self) -> int:
        return self.turns

    def prompt_chars(self) -> int:
        return self.chars

    def original_chars(self) -> int:
        return self.original


def unpacked(sample: Sample | PackedSample) -> Sample:
    return sample.unpack() if isinstance(sample, PackedSample) else sample


QueueItem = Sample | PackedSample


class QueueItems:
    """Samples as columns: what the order needs (source code, turns, prompt chars, original
    chars; numpy arrays) and ``item(i)``, the i-th sample as an object. Built from objects
    (:meth:`of`) or from the plan index's columns (:meth:`columns`); iterating yields the
    objects."""

    __slots__ = ("_make", "_objects", "chars", "names", "original", "source", "turns")

    def __init__(
        self,
        names: list[str],
        source: np.ndarray,
        turns: np.ndarray,
        chars: np.ndarray,
        original: np.ndarray,
        objects: Sequence[QueueItem] | None = None,
        make: Callable[[int], QueueItem] | None = None,
    ) -> None:
        self.names = names  #: source names; ``source`` holds indexes into it
        self.source = source.astype(np.int32, copy=False)
        self.turns = turns.astype(np.int64, copy=False)
        self.chars = chars.astype(np.int64, copy=False)
        self.original = original.astype(np.int64, copy=False)
        self._objects = objects
        self._make = make

    @classmethod
    def of(cls, samples: Iterable[QueueItem]) -> QueueItems:
        objects = list(samples)
        codes: dict[str, int] = {}
        src = np.fromiter((codes.setdefault(s.source, len(codes)) for s in objects),
                          dtype=np.int32, count=len(objects))  # fmt: skip
        turns = np.fromiter((s.turns_to_regenerate() for s in objects), np.int64, len(objects))
        chars = np.fromiter((s.prompt_chars() for s in objects), np.int64, len(objects))
        orig = np.fromiter((s.original_chars() for s in objects), np.int64, len(objects))
        return cls(list(codes), src, turns, chars, orig, objects=objects)

    @classmethod
    def columns(
        cls,
        names: list[str],
        source: np.ndarray,
        turns: np.ndarray,
        chars: np.ndarray,
        original: np.ndarray,
        make: Callable[[int], QueueItem],
    ) -> QueueItems:
        """Items whose objects are made on demand by ``make(i)``."""
        return cls(names, source, turns, chars, original, make=make)

    def __len__(self) -> int:
        return len(self.source)

    def item(self, i: int) -> QueueItem:
        if self._objects is not None:
            return self._objects[i]
        assert self._make is not None
        return self._make(i)

    def __iter__(self) -> Iterator[QueueItem]:
        for i in range(len(self)):
            yield self.item(i)

    def per_source(self) -> dict[str, tuple[int, int]]:
        """{source: (samples, turns to regenerate)}."""
        k = len(self.names)
        n = np.bincount(self.source, minlength=k)
        t = np.bincount(self.source, weights=self.turns, minlength=k)
        return {name: (int(n[c]), int(t[c])) for c, name in enumerate(self.names) if n[c]}
