"""Rows read again where they were found, and what a source file looked like. Owns no files.

The plan index (:mod:`regen.store.planned`) keeps, per planned sample, where its row lives;
this module reads rows back from there and tells whether a file is still the one indexed:

- :func:`file_signature`: size, mtime and the sha256 of the first and last
  :data:`HEAD_TAIL_BYTES` bytes of a file (two reads, whatever the file's size);
  :func:`signature_change` names what differs between two signatures.
- :class:`LineReader`: one JSONL line by its byte offset and length (one ``pread``).
- :func:`parquet_row_starts` / :func:`locate_parquet_row`: a Parquet row ordinal as (row
  group, row in the group); :func:`read_parquet_rows`: only the wanted rows, reading only the
  row groups that hold one, in file order.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: bytes hashed at each end of a file for its signature
HEAD_TAIL_BYTES = 64 * 1024


@dataclass(slots=True, frozen=True)
class FileSignature:
    """What a source file looked like when it was indexed."""

    size: int
    mtime_ns: int
    head_tail: str  #: sha256 (hex) of the first and last HEAD_TAIL_BYTES bytes


def file_signature(path: str | os.PathLike[str]) -> FileSignature:
    """The signature of ``path`` now (OSError when it cannot be read)."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        h = hashlib.sha256()
        h.update(f.read(HEAD_TAIL_BYTES))
        if st.st_size > HEAD_TAIL_BYTES:
            f.seek(max(HEAD_TAIL_BYTES, st.st_size - HEAD_TAIL_BYTES))
            h.update(f.read(HEAD_TAIL_BYTES))
    return FileSignature(st.st_size, st.st_mtime_ns, h.hexdigest())


def signature_change(old: FileSignature, new: FileSignature) -> str:
    """What changed between two signatures of a file ("" when nothing did)."""
    if old.size != new.size:
        return f"size {old.size} -> {new.size} bytes"
    if old.head_tail != new.head_tail:
        return "its first or last bytes differ"
    if old.mtime_ns != new.mtime_ns:
        return "modified since (mtime)"
    return ""


class LineReader:
    """Lines of one JSONL file read by (byte offset, length); the file stays open."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDONLY)

    def read(self, offset: int, length: int) -> bytes:
        data = os.pread(self._fd, length, offset)
        if len(data) != length:
            raise OSError(f"{self.path}: {length} bytes at {offset} wanted, {len(data)} read")
        return data

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def parquet_row_starts(path: str | os.PathLike[str]) -> list[int]:
    """The ordinal (0-based) of the first row of every row group of a Parquet file."""
    import pyarrow.parquet as pq

    meta = pq.read_metadata(path)
    starts, at = [], 0
    for g in range(meta.num_row_groups):
        starts.append(at)
        at += meta.row_group(g).num_rows
    return starts


def locate_parquet_row(starts: list[int], ordinal: int) -> tuple[int, int]:
    """(row group, row in the group) of the 0-based row ``ordinal``."""
    g = bisect.bisect_right(starts, ordinal) - 1
    return g, ordinal - starts[g]


def read_parquet_rows(
    source: object, wanted: dict[int, list[int]], columns: list[str] | None = None
) -> Iterator[tuple[int, int, dict[str, object]]]:
    """``(group, row, data)`` for every row in ``wanted`` ({group: [row in group]}), reading
    only those row groups, in file order. ``source``: a path or an open pyarrow file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(source)
    for g in sorted(wanted):
        rows = sorted(wanted[g])
        table = pf.read_row_group(g, columns=columns).take(pa.array(rows, pa.int64()))
        for r, data in zip(rows, table.to_pylist(), strict=True):
            yield g, r, data
