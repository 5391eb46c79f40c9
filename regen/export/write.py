"""Writing an export's lines: the kept rows' data columns read one row group at a time,
spilled by output position, and rendered as pretokenized or conversation JSON lines (the
shards' names: :mod:`regen.store.layout`).
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterator
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from regen.core.errors import RunDirError
from regen.export.select import Part, with_added_columns
from regen.export.settings import DATA_COLUMNS
from regen.store import layout
from regen.store.layout import ExportFormat
from regen.store.rundir import RunDir

#: output positions per spill bucket (a bucket's lines are held in memory while it is written)
WINDOW_ROWS = 4096


#: at most this many spill buckets (open files) at once; windows grow for huge exports
MAX_BUCKETS = 256


def ordered_lines(
    rd: RunDir,
    parts: list[Part],
    order: list[int],
    fmt: ExportFormat,
    spill: Path,
    *,
    inspect: bool,
) -> Iterator[str]:
    """The JSON line of every row in ``order``, in that order, with bounded memory.

    Pass 1 reads the data columns one row group at a time and appends each kept row's line,
    prefixed with its output position, to the spill bucket of that position. Pass 2 yields the
    buckets in order, each sorted by position.
    """
    position = {row: p for p, row in enumerate(order)}
    window = max(WINDOW_ROWS, -(-len(order) // MAX_BUCKETS))
    n_buckets = -(-len(order) // window)
    if fmt == "pretokenized":
        render = _pretokenized_lines
    else:
        render = partial(_conversation_lines, inspect=inspect)
    files = [(spill / f"b{b:05d}").open("w", encoding="utf-8") for b in range(n_buckets)]
    try:
        for found, rows in read_rows(rd, parts, position, list(DATA_COLUMNS[fmt])):
            for i, line in zip(found, render(rows), strict=True):
                pos = position[i]
                files[pos // window].write(f"{pos}\t{line}\n")
    finally:
        for fh in files:
            fh.close()
    for b in range(n_buckets):
        path = spill / f"b{b:05d}"
        with path.open(encoding="utf-8") as fh:
            entries = [line.rstrip("\n").split("\t", 1) for line in fh]
        path.unlink()
        entries.sort(key=lambda e: int(e[0]))
        for _, line in entries:
            yield line


def read_rows(
    rd: RunDir, parts: list[Part], wanted: Container[int], columns: list[str]
) -> Iterator[tuple[list[int], pa.Table]]:
    """The ``columns`` of the rows numbered in ``wanted``, one row group at a time: (their
    numbers, their rows in that order). A part from before the attempt and quality columns
    gets them filled in (:func:`with_added_columns`)."""
    for part in parts:
        try:
            with rd.fs.open_input_file(part.path) as f:
                pf = pq.ParquetFile(f)
                first = part.start
                for g, n in enumerate(part.group_rows):
                    found = [j for j in range(n) if first + j in wanted]
                    if found:
                        have = [c for c in columns if c in pf.schema_arrow.names]
                        group = with_added_columns(pf.read_row_group(g, columns=have))
                        rows = group.take(pa.array(found, type=pa.int64()))
                        yield [first + j for j in found], rows
                    first += n
        except (OSError, pa.ArrowInvalid) as e:
            raise RunDirError(f"{rd.uri}: cannot read part {part.name}: {e}") from e


def _pretokenized_lines(chunk: pa.Table) -> list[str]:
    ids = chunk.column("input_ids").to_pylist()
    masks = chunk.column("loss_mask").to_pylist()
    return [
        json.dumps({"input_ids": a, "loss_mask": m}, separators=(",", ":"))
        for a, m in zip(ids, masks, strict=True)
    ]


def _conversation_lines(chunk: pa.Table, *, inspect: bool = False) -> list[str]:
    """Conversation records; ``inspect`` adds each row's turn, attempt and quality flags."""
    lines = []
    for r in chunk.to_pylist():
        answer: dict[str, object] = {"role": "assistant", "content": r["content"] or ""}
        if r["reasoning"] is not None:
            answer["reasoning_content"] = r["reasoning"]
        calls = json.loads(r["tool_calls"] or "[]")
        if calls:
            answer["tool_calls"] = calls
        rec: dict[str, object] = {
            "id": r["sample_id"],
            "conversations": [*json.loads(r["messages"] or "[]"), answer],
        }
        if r["tools"]:
            rec["tools"] = json.loads(r["tools"])
        if inspect:
            rec.update(turn=r["turn"], attempt=r["attempt"], quality_flags=r["quality_flags"])
        lines.append(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
    return lines


def remove_old_shards(dest: RunDir, fmt: str) -> None:
    for name in dest.list(""):
        if layout.is_shard(fmt, name):
            dest.delete(name)
