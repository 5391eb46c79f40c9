"""The planned samples read back from an index-backed plan (files:
:mod:`regen.store.planned`).

Where a sample's row is, by the kind of its source:

- local JSONL: ``offset`` and ``length`` of its line in the source file. A resume reads it
  with one ``pread`` when the sample is dispatched (nothing before the first request).
- local Parquet: ``group`` and ``offset`` (row in the group) in the source file; hub:
  the same in ``plan/rows.parquet``. A resume reads the unfinished rows of these at start,
  only the row groups that hold one, in file order, into the plan's spill file.

A row read back goes through its source's adapter again (hub: the stored sample) and must
have the indexed content hash; it gets the indexed id (ids can depend on earlier rows).
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from typing import NoReturn

import numpy as np
import pyarrow as pa

from regen.core.errors import SourceError
from regen.core.sample import Rejection, Sample
from regen.manifest import Source
from regen.plan.index import sample_from_json
from regen.plan.packed import PICKLE_PROTOCOL, Spill
from regen.sources.adapters import adapt_row
from regen.sources.locate import (
    LineReader,
    read_parquet_rows,
)
from regen.sources.reader import RawRow
from regen.store import layout
from regen.store.planned import PlanIndex, invalidate, source_codes, source_kind


@dataclass(slots=True)
class _Entry:
    """What reading one sample's row needs."""

    id: str
    source: str
    content_hash: str
    row: int
    group: int
    offset: int
    length: int


class IndexBodies:
    """The bodies of an index-backed plan (:class:`regen.plan.packed.Bodies`): ``get(i)``
    is the pickle of the sample at row ``i`` of plan/samples.parquet. JSONL rows are read when
    asked; Parquet and hub rows must have been read first (:meth:`preload`)."""

    def __init__(self, index: PlanIndex) -> None:
        self.index = index
        self.sourceset = index.sources  #: the sources the index plans
        t = index.table
        self._ids = t.column("id").combine_chunks()
        self._sources = t.column("source").combine_chunks()
        self._hashes = t.column("content_hash").combine_chunks()
        self._ints = {k: t.column(k).to_numpy() for k in ("row", "group", "offset", "length")}
        self._kinds = {s.name: source_kind(self.sourceset, s) for s in self.sourceset.sources}
        #: the local sources' files, resolved
        self._paths = {s.name: p for s, p in zip(self.sourceset.sources, self.sourceset.paths,
                                                 strict=True) if p is not None}  # fmt: skip
        self._lines: dict[str, LineReader] = {}
        self._spill: Spill | None = None
        self._spilled: dict[int, tuple[int, int]] = {}

    def entry(self, i: int) -> _Entry:
        ints = self._ints
        return _Entry(self._ids[i].as_py(), self._sources[i].as_py(), self._hashes[i].as_py(),
                      int(ints["row"][i]), int(ints["group"][i]), int(ints["offset"][i]),
                      int(ints["length"][i]))  # fmt: skip

    # -- JSONL: one pread per sample -----------------------------------------------------
    def _jsonl(self, e: _Entry) -> Sample:

        source = self.sourceset.source(e.source)
        reader = self._lines.get(e.source)
        try:
            if reader is None:
                reader = self._lines[e.source] = LineReader(self._paths[e.source])
            raw = reader.read(e.offset, e.length)
            data = json.loads(raw.decode("utf-8"))
        except (OSError, ValueError) as ex:
            self._changed(source, e, str(ex))
        if not isinstance(data, dict):
            self._changed(source, e, "not an object")
        return self._check(source, e, adapt_row(source, RawRow(e.row, data, (e.offset, e.length))))

    def _check(self, source: Source, e: _Entry, got: Sample | Rejection) -> Sample:
        if isinstance(got, Rejection):
            self._changed(source, e, got.reason)
        if got.content_hash != e.content_hash:
            self._changed(source, e, "other content")
        got.id = e.id
        return got

    def _changed(self, source: Source, e: _Entry | None, why: str) -> NoReturn:
        where = self.sourceset.field(source) if source.path is not None else layout.PLAN_ROWS
        what = f"row {e.row}" if e is not None else "a row"
        msg = (f"{where}: {what} is not what the plan index recorded ({why}): the source "
               "changed during the run; rerun the command (the index is rebuilt)")  # fmt: skip
        invalidate(self.index.rd, msg)
        raise SourceError(source.name, msg)

    # -- Parquet and hub: read by row group before dispatch --------------------------------
    def preload(self, rows: np.ndarray) -> int:
        """Read the rows of plan entries ``rows`` whose source is Parquet or hub into a spill
        file (only their row groups, in file order); returns how many."""
        by_source: dict[str, dict[int, list[int]]] = {}
        where: dict[tuple[str, int, int], int] = {}
        names = [s.name for s in self.sourceset.sources]
        read_back = np.array([self._kinds[n] != "jsonl" for n in names], dtype=bool)
        if not read_back.any() or not len(rows):
            return 0
        rows = rows[read_back[source_codes(self._sources.take(pa.array(rows)), names)]]
        for i in rows.tolist():
            e = self.entry(i)
            by_source.setdefault(e.source, {}).setdefault(e.group, []).append(e.offset)
            where[(e.source, e.group, e.offset)] = i
        n = 0
        for name, wanted in by_source.items():
            source = self.sourceset.source(name)
            stream: pa.NativeFile | None = None
            if self._kinds[name] == "parquet":
                target: object = str(self._paths[name])
                columns = None
            else:
                stream = self.index.rd.fs.open_input_file(self.index.rd.path(layout.PLAN_ROWS))
                target = stream
                columns = ["sample"]
            try:
                for g, r, data in read_parquet_rows(target, wanted, columns):
                    i = where[(name, g, r)]
                    e = self.entry(i)
                    if columns is None:
                        from regen.sources.adapters import adapt_row

                        got: Sample | Rejection = adapt_row(source, RawRow(e.row, data))
                    else:
                        text = data["sample"]
                        if not isinstance(text, str):
                            raise ValueError("the plan index holds a sample that is not text")
                        got = sample_from_json(text)
                    sample = self._check(source, e, got)
                    if self._spill is None:
                        self._spill = Spill()
                    blob = pickle.dumps(sample, protocol=PICKLE_PROTOCOL)
                    self._spilled[i] = (self._spill.put(blob), len(blob))
                    n += 1
            except (OSError, ValueError, KeyError, pa.ArrowException) as ex:
                self._changed(source, None, str(ex))
            finally:
                if stream is not None:
                    stream.close()
        return n

    def sample(self, i: int) -> Sample:
        """The sample at plan entry ``i``."""
        got = self._spilled.get(i)
        if got is not None:
            assert self._spill is not None
            s: Sample = pickle.loads(self._spill.get(*got))
            return s
        return self._jsonl(self.entry(i))

    def get(self, at: int, size: int) -> bytes:
        got = self._spilled.get(at)
        if got is not None:
            assert self._spill is not None
            return self._spill.get(*got)
        return pickle.dumps(self._jsonl(self.entry(at)), protocol=PICKLE_PROTOCOL)

    def close(self) -> None:
        for r in self._lines.values():
            r.close()
        self._lines.clear()
        if self._spill is not None:
            self._spill.close()
            self._spill = None

    def __enter__(self) -> IndexBodies:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
