"""The work of one session, from the plan index: per-source totals, the samples to
regenerate (columns; bodies read when popped) and the native rows to store. Owns no files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from regen.core.sample import Sample
from regen.plan.bodies import IndexBodies
from regen.plan.packed import PackedSample, QueueItems
from regen.store.planned import PlanIndex, source_codes


@dataclass(slots=True)
class IndexedPlan:
    """What :func:`select` found in the index for one session."""

    todo: QueueItems
    native: list[Sample] = field(default_factory=list)
    totals: dict[str, tuple[int, bool]] = field(default_factory=dict)
    skipped_failed: int = 0


def select(
    index: PlanIndex,
    bodies: IndexBodies,
    done: set[str],
    skip: set[str],
    limit: int | None,
) -> IndexedPlan:
    """The index's entries for this session: totals per source (every planned sample), the
    samples to regenerate (columns; bodies read when popped) and the native rows to store
    (read now), leaving out ``done`` and ``skip`` (recorded permanent failures)."""
    sources = index.sources.sources
    t = index.entries(limit)
    ids = t.column("id")

    def flags(col: pa.ChunkedArray) -> np.ndarray:
        return np.asarray(col.to_numpy(zero_copy_only=False), dtype=bool)

    keep_np = ~flags(t.column("repeat"))
    left = keep_np & ~flags(pc.is_in(ids, value_set=pa.array(list(done), pa.string())))
    skip_np = left & flags(pc.is_in(ids, value_set=pa.array(list(skip), pa.string())))
    left &= ~skip_np
    native_np = flags(t.column("native"))
    names = [s.name for s in sources]
    src = source_codes(t.column("source"), names)
    counts = np.bincount(src[keep_np], minlength=len(names))
    totals = {s.name: (int(counts[c]), s.mode == "regenerate") for c, s in enumerate(sources)}
    todo_rows = np.flatnonzero(left & ~native_np)
    native_rows = np.flatnonzero(left & native_np)
    bodies.preload(np.concatenate([todo_rows, native_rows]))
    native = [bodies.sample(int(i)) for i in native_rows]
    turns = t.column("turns").to_numpy()[todo_rows]
    chars = t.column("prompt_chars").to_numpy()[todo_rows]
    orig = t.column("original_chars").to_numpy()[todo_rows]
    todo_src = src[todo_rows]
    id_col = ids.combine_chunks()

    def make(j: int) -> PackedSample:
        i = int(todo_rows[j])
        return PackedSample(id_col[i].as_py(), names[todo_src[j]], int(turns[j]), int(chars[j]),
                            int(orig[j]), at=i)  # fmt: skip

    todo = QueueItems.columns(names, todo_src, turns, chars, orig, make)
    return IndexedPlan(todo, native, totals, int(skip_np.sum()))
