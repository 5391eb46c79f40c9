"""The plan index: which samples a run plans and where their rows are, so that a resume reads
the index and the done-set, then only the unfinished rows.

Files (names and records in :mod:`regen.store.layout`)::

    plan/samples.parquet  one row per item of the planned stream (:func:`iter_planned`'s
                          order, repeated ids included and flagged): the columns of
                          :data:`SCHEMA` — id, source, native, repeat, the cost-model inputs
                          (turns, prompt_chars, original_chars), content_hash, and where the
                          row lives (row, group, offset, length)
    plan/rows.parquet     hub sources only: the planned samples themselves, as JSON
                          (``sample`` column), ROWS_GROUP rows per row group
    plan/index.json       PlanIndexRecord, written last: the key, the --limit it holds, each
                          source file's signature, the two files' sizes and sha256

Where a sample's row is, by the kind of its source:

- local JSONL: ``offset`` and ``length`` of its line in the source file. A resume reads it
  with one ``pread`` when the sample is dispatched (nothing before the first request).
- local Parquet: ``group`` and ``offset`` (row in the group) in the source file; hub:
  the same in ``plan/rows.parquet``. A resume reads the unfinished rows of these at start,
  only the row groups that hold one, in file order, into the plan's spill file.

A row read back goes through its source's adapter again (hub: the stored sample) and must
have the indexed content hash; it gets the indexed id (ids can depend on earlier rows).

Validity (:func:`open_index`): the index is used only when all of these hold, else the sources
are read as before and the index is written again, with one line saying why:

- ``plan/index.json`` parses, and has this module's :data:`INDEX_VERSION`;
- its key equals this manifest's (:func:`index_keys`: the sources' definitions — adapter,
  path or hub id, config, split and revision, mode, turns, filters, limit — the dedup
  settings, the native check's tokenizer files when a native source exists, regen's version);
- the stream it holds covers this session's ``--limit`` (it was read to its end, or was cut
  at a limit at least as large);
- every local source file has the indexed size, mtime and head/tail hash;
- ``plan/samples.parquet`` has the recorded size and sha256, and ``plan/rows.parquet`` the
  recorded size.

The planned stream is :func:`iter_planned` (the manifest's samples through adapters, filters,
dedup, near-duplicates and limits, in order): what the index holds when it is valid, and what
a session (or ``regen verify``) reads without one.

A torn or damaged index is therefore rebuilt, never trusted: it can neither drop nor invent a
sample. A row that no longer matches its content hash when read (the file changed during the
run) stops the session with one error and deletes ``plan/index.json``; the rerun rebuilds it.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import pickle
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from regen import __version__
from regen.errors import RegenError, RunDirError, SourceError
from regen.manifest import Manifest, Source
from regen.packed import PICKLE_PROTOCOL, PackedSample, QueueItems, Spill
from regen.sample import Message, Rejection, Sample, stable_hash
from regen.sources.locate import (
    FileSignature,
    LineReader,
    dir_signature,
    file_signature,
    locate_parquet_row,
    parquet_row_starts,
    read_parquet_rows,
    signature_change,
)
from regen.sources.reader import JSONL_SUFFIXES, RawRow, source_field
from regen.store import layout
from regen.store.layout import IndexedFile, IndexedSource, PlanIndexRecord
from regen.store.rundir import RunDir

log = logging.getLogger(__name__)

#: format of plan/: a resume ignores (and rebuilds) an index of another version
INDEX_VERSION = 1
#: samples per row group of plan/rows.parquet
ROWS_GROUP = 256

#: plan/samples.parquet
SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("native", pa.bool_(), nullable=False),  # mode native (stored, not requested)
        pa.field("repeat", pa.bool_(), nullable=False),  # id seen earlier in the stream
        pa.field("turns", pa.int32(), nullable=False),  # turns to regenerate
        pa.field("prompt_chars", pa.int64(), nullable=False),
        pa.field("original_chars", pa.int64(), nullable=False),
        pa.field("content_hash", pa.string(), nullable=False),  # Sample.content_hash
        pa.field("row", pa.int64(), nullable=False),  # 1-based row in the source
        pa.field("group", pa.int32(), nullable=False),  # Parquet/hub: row group; JSONL: -1
        pa.field("offset", pa.int64(), nullable=False),  # JSONL: byte offset; else row in group
        pa.field("length", pa.int32(), nullable=False),  # JSONL: line bytes; else 0
    ]
)


def source_kind(manifest: Manifest, source: Source) -> str:
    """ "jsonl", "parquet" or "hub" (as regen.sources.reader decides)."""
    if source.path is None:
        return "hub"
    jsonl = manifest.resolve(source.path).name.lower().endswith(JSONL_SUFFIXES)
    return "jsonl" if jsonl else "parquet"


def source_codes(column: pa.ChunkedArray | pa.Array, names: list[str]) -> np.ndarray:
    """A column of source names as indexes into ``names`` (int32)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    enc = arr.dictionary_encode()
    code = {n: c for c, n in enumerate(names)}
    lut = np.array([code[x] for x in enc.dictionary.to_pylist()], dtype=np.int32)
    return lut[enc.indices.to_numpy(zero_copy_only=False)] if len(lut) else np.zeros(0, np.int32)


def index_keys(manifest: Manifest) -> dict[str, str]:
    """The components of the index key: everything that decides which samples are planned."""
    keys = {
        "format": str(INDEX_VERSION),
        "regen": __version__,
        "sources": stable_hash(
            [s.model_dump(mode="json", exclude={"output_tokens"}) for s in manifest.sources], n=32
        ),
        "dedup": stable_hash(manifest.dedup.model_dump(mode="json"), n=32),
    }
    if any(s.mode == "native" for s in manifest.sources):
        tok = manifest.target
        keys["native_check"] = stable_hash(
            [dir_signature(manifest.resolve(tok.tokenizer)), tok.trust_remote_code], n=32
        )
    return keys


def _key(keys: dict[str, str]) -> str:
    return stable_hash(keys, n=32)


def _indexed_source(manifest: Manifest, source: Source) -> IndexedSource:
    kind = source_kind(manifest, source)
    if kind == "hub":
        return IndexedSource(kind="hub")
    path = manifest.resolve(source.path or "")
    sig = file_signature(path)
    return IndexedSource(kind=kind, path=str(path), size=sig.size, mtime_ns=sig.mtime_ns,  # type: ignore[arg-type]
                         head_tail=sig.head_tail)  # fmt: skip


def _sig(s: IndexedSource) -> FileSignature:
    return FileSignature(s.size, s.mtime_ns, s.head_tail)


# ---- the planned stream --------------------------------------------------------------------


def native_check(manifest: Manifest) -> Callable[[Sample], str | None] | None:
    """The check of native rows against the target tokenizer's vocabulary (None: no native
    source)."""
    if not any(s.mode == "native" for s in manifest.sources):
        return None
    from regen.native import VocabInfo, validate_native

    vocab = VocabInfo.from_dir(
        manifest.resolve(manifest.target.tokenizer),
        manifest.family(),
        trust_remote_code=manifest.target.trust_remote_code,
    )
    return lambda s: validate_native(s, vocab)


def iter_planned(manifest: Manifest, limit: int | None) -> Iterator[Sample]:
    """Every sample of the manifest in plan order (what a session without a valid index reads)."""
    from regen.sources import read_samples

    samples: Iterator[Sample] = read_samples(manifest, None, native_check(manifest))
    return itertools.islice(samples, limit) if limit is not None else samples


# ---- samples as JSON (hub rows) --------------------------------------------------------------


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


# ---- building --------------------------------------------------------------------------------


class IndexBuilder:
    """Collects one entry per stream item while planning reads the sources; :meth:`write`
    stores them (typed arrays: ~60 bytes per sample besides the ids)."""

    def __init__(self, rd: RunDir, manifest: Manifest) -> None:
        self.rd = rd
        self.m = manifest
        self.kinds = {s.name: source_kind(manifest, s) for s in manifest.sources}
        self.codes = {s.name: i for i, s in enumerate(manifest.sources)}
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
                    path = self.m.resolve(self.m.source(sample.source).path or "")
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
            self._rows_tmp = f"{layout.PLAN_DIR}/{layout.TMP_PREFIX}rows-{time.time_ns()}"
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
        names = [s.name for s in self.m.sources]
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
            keys = index_keys(self.m)
            rec = PlanIndexRecord(
                version=INDEX_VERSION,
                key=_key(keys),
                keys=keys,
                limit=limit,
                complete=complete,
                samples=len(self.ids),
                sources={s.name: _indexed_source(self.m, s) for s in self.m.sources},
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


ROWS_SCHEMA = pa.schema([pa.field("sample", pa.string(), nullable=False)])


# ---- opening -----------------------------------------------------------------------------------


@dataclass(slots=True)
class PlanIndex:
    """A valid index of this manifest's plan."""

    rd: RunDir
    manifest: Manifest
    record: PlanIndexRecord
    table: pa.Table  #: plan/samples.parquet

    def entries(self, limit: int | None) -> pa.Table:
        """The stream's first ``limit`` items (all when None), as the planned stream had them."""
        return self.table if limit is None else self.table.slice(0, limit)

    def planned_ids(self, limit: int | None) -> set[str]:
        """The ids the plan holds (repeats dropped)."""
        t = self.entries(limit)
        keep = t.filter(pc.invert(t.column("repeat")))
        return set(keep.column("id").to_pylist())


def open_index(rd: RunDir, manifest: Manifest, limit: int | None) -> tuple[PlanIndex | None, str]:
    """The plan index when it is valid for ``manifest`` and ``limit`` (module docstring), else
    (None, why not)."""
    rec, why = _read_record(rd)
    if rec is None:
        return None, why
    keys = index_keys(manifest)
    if rec.key != _key(keys):
        changed = sorted(k for k in keys.keys() | rec.keys.keys() if keys.get(k) != rec.keys.get(k))
        what = {"sources": "the sources' definitions", "dedup": "the dedup settings",
                "native_check": "the native check's tokenizer", "regen": "regen's version",
                "format": "the index format"}  # fmt: skip
        return None, "changed since it was written: " + ", ".join(what.get(k, k) for k in changed)
    if not rec.complete and (limit is None or rec.limit is None or limit > rec.limit):
        want = "all samples" if limit is None else f"--limit {limit}"
        return None, f"it holds the first {rec.limit} samples and this session plans {want}"
    for i, s in enumerate(manifest.sources):
        got = rec.sources.get(s.name)
        kind = source_kind(manifest, s)
        if got is None or got.kind != kind:
            return None, f"source {s.name!r} is not in it as a {kind} source"
        if kind == "hub":
            continue
        path = manifest.resolve(s.path or "")
        if str(path) != got.path:
            return None, f"sources.{i}.path is {path}, it indexed {got.path}"
        try:
            change = signature_change(_sig(got), file_signature(path))
        except OSError as e:
            return None, f"sources.{i}.path {path}: {e}"
        if change:
            return None, f"sources.{i}.path {path} changed since it was indexed: {change}"
    want_files = {layout.PLAN_SAMPLES} | ({layout.PLAN_ROWS} if any(
        v.kind == "hub" for v in rec.sources.values()) else set())  # fmt: skip
    if set(rec.files) != want_files:
        return None, f"{layout.PLAN_INDEX} lists files {sorted(rec.files)}"
    for name, f in rec.files.items():
        size = rd.size(name) if rd.exists(name) else None
        if size != f.bytes:
            return None, f"{name} is {size} bytes, the index says {f.bytes}"
    table, why = _read_samples(rd, rec)
    if table is None:
        return None, why
    return PlanIndex(rd, manifest, rec, table), ""


def _read_record(rd: RunDir) -> tuple[PlanIndexRecord | None, str]:
    """plan/index.json of this format, or (None, why not: "" when there is none)."""
    try:
        rec = layout.PLAN_INDEX_FILE.read(rd)
    except RunDirError as e:
        return None, str(e)
    if rec is not None and rec.version != INDEX_VERSION:
        why = f"{layout.PLAN_INDEX} has format {rec.version}, this regen uses {INDEX_VERSION}"
        return None, why
    return rec, ""


def _read_samples(rd: RunDir, rec: PlanIndexRecord) -> tuple[pa.Table | None, str]:
    """plan/samples.parquet when it is the file ``rec`` describes (size, sha256, schema, rows),
    else (None, why not)."""
    want = rec.files.get(layout.PLAN_SAMPLES)
    data = rd.read_bytes(layout.PLAN_SAMPLES)
    if want is None or data is None:
        return None, f"{layout.PLAN_SAMPLES} is missing"
    if len(data) != want.bytes or hashlib.sha256(data).hexdigest() != want.sha256:
        return None, f"{layout.PLAN_SAMPLES} is not the file {layout.PLAN_INDEX} describes"
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (OSError, pa.ArrowException) as e:
        return None, f"{layout.PLAN_SAMPLES} is unreadable ({e})"
    if not table.schema.equals(SCHEMA) or table.num_rows != rec.samples:
        return None, f"{layout.PLAN_SAMPLES} does not hold what the index says"
    return table, ""


def recorded_plan(rd: RunDir) -> tuple[pa.Table | None, str]:
    """The samples the latest session planned, as it recorded them, whatever the sources hold
    now: ``(id, source, content_hash)`` of plan/samples.parquet's entries (repeats dropped) cut
    at plan.json's ``--limit``. ``(None, "")`` when there is no index (a run from before it, or
    a session that could not write it), ``(None, why)`` when it is damaged: index.json does not
    parse, or plan/samples.parquet is not the file it describes."""
    rec, why = _read_record(rd)
    if rec is None:
        return None, why
    try:
        plan = layout.PLAN_FILE.read(rd)
    except RunDirError as e:
        return None, str(e)
    table, why = _read_samples(rd, rec)
    if table is None:
        return None, why
    limit = plan.limit if plan is not None else rec.limit
    if limit is not None:
        table = table.slice(0, limit)
    table = table.filter(pc.invert(table.column("repeat")))
    return table.select(["id", "source", "content_hash"]), ""


def rebuild(rd: RunDir, manifest: Manifest, limit: int | None) -> bool:
    """Write plan/ again from the sources (what a session does without a valid index): the
    planned stream of ``manifest`` cut at ``limit``. False (with one warning) when it could not
    be written; a source that cannot be read raises (SourceError, OSError)."""
    builder = IndexBuilder(rd, manifest)
    seen: set[str] = set()
    read = 0
    try:
        for s in iter_planned(manifest, limit):
            read += 1
            builder.add(s, repeat=s.id in seen)
            seen.add(s.id)
    except BaseException:
        builder.discard()
        raise
    return builder.write(limit=limit, complete=limit is None or read < limit)


def invalidate(rd: RunDir, why: str) -> None:
    """Delete plan/index.json: the next session reads the sources and writes it again."""
    try:
        rd.delete(layout.PLAN_INDEX)
    except (OSError, RegenError) as e:
        log.warning("could not delete %s (%s)", layout.PLAN_INDEX, e)
    log.warning("%s deleted: %s", layout.PLAN_INDEX, why)


# ---- reading bodies ----------------------------------------------------------------------------


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
    """The bodies of an index-backed plan (:class:`regen.packed.Bodies`): ``get(i)``
    is the pickle of the sample at row ``i`` of plan/samples.parquet. JSONL rows are read when
    asked; Parquet and hub rows must have been read first (:meth:`preload`)."""

    def __init__(self, index: PlanIndex) -> None:
        self.index = index
        self.m = index.manifest
        t = index.table
        self._ids = t.column("id").combine_chunks()
        self._sources = t.column("source").combine_chunks()
        self._hashes = t.column("content_hash").combine_chunks()
        self._ints = {k: t.column(k).to_numpy() for k in ("row", "group", "offset", "length")}
        self._kinds = {s.name: source_kind(self.m, s) for s in self.m.sources}
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
        from regen.sources.adapters import adapt_row

        source = self.m.source(e.source)
        reader = self._lines.get(e.source)
        try:
            if reader is None:
                reader = self._lines[e.source] = LineReader(self.m.resolve(source.path or ""))
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

    def _changed(self, source: Source, e: _Entry | None, why: str) -> Any:
        where = source_field(self.m, source) if source.path is not None else layout.PLAN_ROWS
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
        names = [s.name for s in self.m.sources]
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
            source = self.m.source(name)
            if self._kinds[name] == "parquet":
                target: Any = str(self.m.resolve(source.path or ""))
                columns = None
            else:
                target = self.index.rd.fs.open_input_file(self.index.rd.path(layout.PLAN_ROWS))
                columns = ["sample"]
            try:
                for g, r, data in read_parquet_rows(target, wanted, columns):
                    i = where[(name, g, r)]
                    e = self.entry(i)
                    if columns is None:
                        from regen.sources.adapters import adapt_row

                        got: Sample | Rejection = adapt_row(source, RawRow(e.row, data))
                    else:
                        got = sample_from_json(data["sample"])
                    sample = self._check(source, e, got)
                    if self._spill is None:
                        self._spill = Spill()
                    blob = pickle.dumps(sample, protocol=PICKLE_PROTOCOL)
                    self._spilled[i] = (self._spill.put(blob), len(blob))
                    n += 1
            except (OSError, ValueError, KeyError, pa.ArrowException) as ex:
                self._changed(source, None, str(ex))
            finally:
                if columns is not None:
                    target.close()
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
    m = index.manifest
    t = index.entries(limit)
    ids = t.column("id")

    def flags(col: Any) -> np.ndarray:
        return np.asarray(col.to_numpy(zero_copy_only=False), dtype=bool)

    keep_np = ~flags(t.column("repeat"))
    left = keep_np & ~flags(pc.is_in(ids, value_set=pa.array(list(done), pa.string())))
    skip_np = left & flags(pc.is_in(ids, value_set=pa.array(list(skip), pa.string())))
    left &= ~skip_np
    native_np = flags(t.column("native"))
    names = [s.name for s in m.sources]
    src = source_codes(t.column("source"), names)
    counts = np.bincount(src[keep_np], minlength=len(names))
    totals = {s.name: (int(counts[c]), s.mode == "regenerate") for c, s in enumerate(m.sources)}
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
