"""The planned stream and the plan index written from it.

:func:`iter_planned` is the manifest's samples (its :class:`~regen.sources.SourceSet`) through
adapters, filters, dedup, near-duplicates and limits, in order: what the index holds, and what
a session (or ``regen verify``) reads without a valid one. :class:`IndexBuilder` collects one
entry per item while a session plans, and writes plan/ (files and validity:
:mod:`regen.store.planned`); :func:`rebuild` writes it again from the sources.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import time
from array import array
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from regen import __version__
from regen.core.errors import RegenError
from regen.core.sample import Message, Sample
from regen.sources import SourceSet, read_samples
from regen.sources.locate import (
    locate_parquet_row,
    parquet_row_starts,
)
from regen.sources.native import VocabInfo, validate_native
from regen.store import layout
from regen.store.layout import IndexedFile, PlanIndexRecord
from regen.store.planned import (
    INDEX_VERSION,
    ROWS_GROUP,
    ROWS_SCHEMA,
    SCHEMA,
    index_key,
    index_keys,
    indexed_source,
    invalidate,
    source_kind,
)
from regen.store.rundir import TMP_PREFIX, RunDir

log = logging.getLogger(__name__)


def native_check(sources: SourceSet) -> Callable[[Sample], str | None] | None:
    """The check of native rows against the target tokenizer's vocabulary (None: no native
    source)."""
    native = sources.native
    if native is None:
        return None

    vocab = VocabInfo.from_dir(
        native.tokenizer, native.family(), trust_remote_code=native.trust_remote_code
    )
    return lambda s: validate_native(s, vocab)


def iter_planned(sources: SourceSet, limit: int | None) -> Iterator[Sample]:
    """Every sample of ``sources`` in plan order (what a session without a valid index reads)."""

    samples: Iterator[Sample] = read_samples(sources, None, native_check(sources))
    return itertools.islice(samples, limit) if limit is not None else samples


def sample_to_json(sample: Sample) -> str:
    return json.dumps(
        {
            "id": sample.id,
            "source": sample.source,
            "messages": [m.to_openai() for m in sample.messages],
            "tools": sample.tools,
            "mode": sample.mode,
            "turns": sample.turns,
            "input_ids": sample.input_ids,
            "loss_mask": sample.loss_mask,
            "row": sample.row,
            "meta": sample.meta,
        },
        ensure_ascii=False,
    )


def sample_from_json(text: str) -> Sample:
    d = json.loads(text)
    return Sample(
        id=d["id"],
        source=d["source"],
        messages=[Message.from_openai(m) for m in d["messages"]],
        tools=d["tools"],
        mode=d["mode"],
        turns=d["turns"],
        input_ids=d["input_ids"],
        loss_mask=d["loss_mask"],
        row=d["row"],
        meta=d["meta"],
    )


class IndexBuilder:
    """Collects one entry per stream item while planning reads the sources; :meth:`write`
    stores them (typed arrays: ~60 bytes per sample besides the ids)."""

    def __init__(self, rd: RunDir, sources: SourceSet) -> None:
        self.rd = rd
        self.sources = sources
        self.kinds = {s.name: source_kind(sources, s) for s in sources.sources}
        self.codes = {s.name: i for i, s in enumerate(sources.sources)}
        self.ids: list[str] = []
        self.hashes: list[str] = []
        self.src = array("h")
        self.flags = bytearray()  # bit 0: native, bit 1: repeat
        self.ints = {k: array("q") for k in ("turns", "prompt_chars", "original_chars", "row",
                                             "group", "offset", "length")}  # fmt: skip
        self._starts: dict[str, list[int]] = {}
        self._rows_tmp: str | None = None
        self._rows_writer: pq.ParquetWriter | None = None
        self._rows_stream: Any = None
        self._rows_buf: list[str] = []
        self._rows_n = 0
        self.failed = ""  #: why the index cannot be written ("" while it can)

    def add(self, sample: Sample, *, repeat: bool) -> None:
        if self.failed:
            return
        kind = self.kinds[sample.source]
        group, offset, length = -1, 0, 0
        try:
            if kind == "jsonl":
                if sample.loc is None:
                    raise ValueError(f"{sample.id}: the reader gave no byte offset")
                offset, length = sample.loc
            elif kind == "parquet":
                starts = self._starts.get(sample.source)
                if starts is None:
                    path = self.sources.local_file(self.sources.source(sample.source))
                    assert path is not None  # a Parquet source is a local file
                    starts = self._starts[sample.source] = parquet_row_starts(path)
                group, offset = locate_parquet_row(starts, sample.row - 1)
            elif not repeat:  # hub: keep the sample itself
                group, offset = divmod(self._rows_n, ROWS_GROUP)
                self._add_row(sample_to_json(sample))
        except (OSError, ValueError, TypeError, pa.ArrowException) as e:
            self.failed = f"{sample.source} row {sample.row}: {e}"
            return
        self.ids.append(sample.id)
        self.hashes.append(sample.content_hash)
        self.src.append(self.codes[sample.source])
        self.flags.append((sample.mode == "native") | (repeat << 1))
        ints = self.ints
        ints["turns"].append(sample.turns_to_regenerate())
        ints["prompt_chars"].append(sample.prompt_chars())
        ints["original_chars"].append(sample.original_chars())
        ints["row"].append(sample.row)
        ints["group"].append(group)
        ints["offset"].append(offset)
        ints["length"].append(length)

    def _add_row(self, text: str) -> None:
        if self._rows_writer is None:
            self.rd.makedirs(layout.PLAN_DIR)
            self._rows_tmp = f"{layout.PLAN_DIR}/{TMP_PREFIX}rows-{time.time_ns()}"
            self._rows_stream = self.rd.fs.open_output_stream(self.rd.path(self._rows_tmp))
            self._rows_writer = pq.ParquetWriter(self._rows_stream, ROWS_SCHEMA,
                                                 compression="zstd")  # fmt: skip
        self._rows_buf.append(text)
        self._rows_n += 1
        if len(self._rows_buf) >= ROWS_GROUP:
            self._flush_rows()

    def _flush_rows(self) -> None:
        if self._rows_buf and self._rows_writer is not None:
            batch = pa.table({"sample": pa.array(self._rows_buf, pa.string())}, ROWS_SCHEMA)
            self._rows_writer.write_table(batch, row_group_size=ROWS_GROUP)
            self._rows_buf = []

    def discard(self) -> None:
        """Drop what was written so far (the stream failed)."""
        self._close_rows()
        if self._rows_tmp is not None:
            self.rd.delete(self._rows_tmp)
            self._rows_tmp = None

    def _close_rows(self) -> None:
        if self._rows_writer is not None:
            self._flush_rows()
            self._rows_writer.close()
            self._rows_stream.close()
            self._rows_writer = None

    def table(self) -> pa.Table:
        names = [s.name for s in self.sources.sources]
        flags = np.frombuffer(bytes(self.flags), dtype=np.uint8)
        ints = {k: np.frombuffer(v, dtype=np.int64) if len(v) else np.zeros(0, np.int64)
                for k, v in self.ints.items()}  # fmt: skip
        src = np.frombuffer(self.src, dtype=np.int16) if len(self.src) else np.zeros(0, np.int16)
        cols = {
            "id": pa.array(self.ids, pa.string()),
            "source": pa.array(names, pa.string()).take(pa.array(src.astype(np.int32))),
            "native": pa.array((flags & 1).astype(bool)),
            "repeat": pa.array((flags & 2).astype(bool)),
            "content_hash": pa.array(self.hashes, pa.string()),
        }
        for k, v in ints.items():
            cols[k] = pa.array(v)
        return pa.table(cols).select(SCHEMA.names).cast(SCHEMA)

    def write(self, *, limit: int | None, complete: bool) -> bool:
        """Write plan/ (data files first, the record last); False (with one warning) when it
        could not be: the next resume then reads the sources again."""
        try:
            if self.failed:
                raise ValueError(self.failed)
            self._close_rows()
            rd = self.rd
            rd.makedirs(layout.PLAN_DIR)
            files: dict[str, IndexedFile] = {}
            if self._rows_tmp is not None:
                rd.delete(layout.PLAN_ROWS)
                rd.move(self._rows_tmp, layout.PLAN_ROWS)
                self._rows_tmp = None
                files[layout.PLAN_ROWS] = IndexedFile(bytes=rd.size(layout.PLAN_ROWS))
            else:
                rd.delete(layout.PLAN_ROWS)
            sink = io.BytesIO()
            pq.write_table(self.table(), sink, compression="zstd")
            data = sink.getvalue()
            rd.write_bytes_atomic(layout.PLAN_SAMPLES, data)
            digest = hashlib.sha256(data).hexdigest()
            files[layout.PLAN_SAMPLES] = IndexedFile(bytes=len(data), sha256=digest)
            keys = index_keys(self.sources)
            rec = PlanIndexRecord(
                version=INDEX_VERSION,
                key=index_key(keys),
                keys=keys,
                limit=limit,
                complete=complete,
                samples=len(self.ids),
                sources={s.name: indexed_source(self.sources, s) for s in self.sources.sources},
                files=files,
                built_at=time.time(),
                regen_version=__version__,
            )
            layout.PLAN_INDEX_FILE.write(rd, rec)
        except (OSError, ValueError, RegenError, pa.ArrowException) as e:
            self.discard()
            log.warning("the plan index was not written (%s): the next resume reads the "
                        "sources again", e)  # fmt: skip
            if self.rd.exists(layout.PLAN_INDEX):  # an older plan's: no longer this one
                invalidate(self.rd, "it holds an earlier plan")
            return False
        log.info("plan index written: %d samples (%s)", len(self.ids), layout.PLAN_INDEX)
        return True


def rebuild(rd: RunDir, sources: SourceSet, limit: int | None) -> bool:
    """Write plan/ again from the sources (what a session does without a valid index): the
    planned stream of ``sources`` cut at ``limit``. False (with one warning) when it could not
    be written; a source that cannot be read raises (SourceError, OSError)."""
    builder = IndexBuilder(rd, sources)
    seen: set[str] = set()
    read = 0
    try:
        for s in iter_planned(sources, limit):
            read += 1
            builder.add(s, repeat=s.id in seen)
            seen.add(s.id)
    except BaseException:
        builder.discard()
        raise
    return builder.write(limit=limit, complete=limit is None or read < limit)
