"""A completed sample: one sample whose every turn is done, as it is journaled and stored.
Owns no files (a journal segment holds its :meth:`CompletedSample.to_line`, a part its rows:
:mod:`regen.store.segments`, :mod:`regen.store.parts`)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

from regen.store.counts import SourceCounts, count_rows, net_counts
from regen.store.schema import Row


@dataclass(slots=True)
class CompletedSample:
    """One sample whose every turn is done: what a journal line holds.

    A worker may have done the encoding already (regen.engine.wire): then ``line`` is its
    journal line, ``table`` its rows (regen.store.schema.SCHEMA), ``counts`` their counters, and
    ``rows`` may be empty."""

    sample_id: str
    source: str
    rows: list[Row]
    #: a new attempt: the counters of the answer it replaces (None: the first answer)
    replaces: SourceCounts | None = None
    line: bytes | None = None  #: its journal line without ``replaces``, when packed
    table: pa.Table | None = None  #: its rows, when packed
    own: SourceCounts | None = None  #: the counters of its rows, when packed

    def to_line(self) -> bytes:
        line = self.line
        if line is None:
            obj = {"sample_id": self.sample_id, "source": self.source, "rows": self.rows}
            line = (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        if self.replaces is None:
            return line
        # the key after "rows", as a dict holding it serializes (byte-equal either way)
        extra = json.dumps(self.replaces.model_dump(), separators=(",", ":")).encode()
        return line[:-2] + b',"replaces":' + extra + b"}\n"

    def counts(self) -> SourceCounts:
        """This sample's counters (the difference from the answer it replaces, if any)."""
        own = self.own if self.own is not None else count_rows(self.rows)
        return net_counts(own, self.replaces)
