"""The plan index as the run directory keeps it: which samples a run plans and where their
rows are, so that a resume reads the index and the done-set, then only the unfinished rows.
Written by :mod:`regen.plan.index`; read here by the driver, ``regen verify`` and its repair.

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

Validity (:func:`open_index`): the index is used only when all of these hold, else the sources
are read as before and the index is written again, with one line saying why:

- ``plan/index.json`` parses, and has this module's :data:`INDEX_VERSION`;
- its key equals this plan's (:func:`index_keys` of the manifest's
  :class:`~regen.sources.sourceset.SourceSet`: the sources' definitions — adapter,
  path or hub id, config, split and revision, mode, turns, filters, limit — the dedup
  settings, the native check's tokenizer files when a native source exists, regen's version);
- the stream it holds covers this session's ``--limit`` (it was read to its end, or was cut
  at a limit at least as large);
- every local source file has the indexed size, mtime and head/tail hash;
- ``plan/samples.parquet`` has the recorded size and sha256, and ``plan/rows.parquet`` the
  recorded size.

The planned stream is :func:`regen.plan.index.iter_planned` (the manifest's samples through
adapters, filters, dedup, near-duplicates and limits, in order): what the index holds when it
is valid, and what a session (or ``regen verify``) reads without one.

A torn or damaged index is therefore rebuilt, never trusted: it can neither drop nor invent a
sample. A row that no longer matches its content hash when read (the file changed during the
run) stops the session with one error and deletes ``plan/index.json``; the rerun rebuilds it.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from regen import __version__
from regen.core.errors import RegenError, RunDirError
from regen.core.sample import stable_hash
from regen.manifest import Source
from regen.sources.locate import (
    FileSignature,
    file_signature,
    signature_change,
)
from regen.sources.reader import JSONL_SUFFIXES
from regen.sources.sourceset import SourceSet
from regen.store import layout
from regen.store.layout import IndexedSource, PlanIndexRecord
from regen.store.rundir import RunDir
from regen.template.tokenizer_classes import dir_signature

log = logging.getLogger(__name__)

#: where a source's rows come from (as regen.sources.reader decides)
SourceKind = Literal["jsonl", "parquet", "hub"]

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

ROWS_SCHEMA = pa.schema([pa.field("sample", pa.string(), nullable=False)])


def source_kind(sources: SourceSet, source: Source) -> SourceKind:
    """ "jsonl", "parquet" or "hub" (as regen.sources.reader decides)."""
    path = sources.local_file(source)
    if path is None:
        return "hub"
    return "jsonl" if path.name.lower().endswith(JSONL_SUFFIXES) else "parquet"


def source_codes(column: pa.ChunkedArray | pa.Array, names: list[str]) -> np.ndarray:
    """A column of source names as indexes into ``names`` (int32)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    enc = arr.dictionary_encode()
    code = {n: c for c, n in enumerate(names)}
    lut = np.array([code[x] for x in enc.dictionary.to_pylist()], dtype=np.int32)
    return lut[enc.indices.to_numpy(zero_copy_only=False)] if len(lut) else np.zeros(0, np.int32)


def index_keys(sources: SourceSet) -> dict[str, str]:
    """The components of the index key: everything that decides which samples are planned."""
    keys = {
        "format": str(INDEX_VERSION),
        "regen": __version__,
        "sources": stable_hash(
            [s.model_dump(mode="json", exclude={"output_tokens"}) for s in sources.sources], n=32
        ),
        "dedup": stable_hash(sources.dedup.model_dump(mode="json"), n=32),
    }
    if sources.native is not None:
        native = sources.native
        keys["native_check"] = stable_hash(
            [dir_signature(native.tokenizer), native.trust_remote_code], n=32
        )
    return keys


def index_key(keys: dict[str, str]) -> str:
    return stable_hash(keys, n=32)


def indexed_source(sources: SourceSet, source: Source) -> IndexedSource:
    path = sources.local_file(source)
    if path is None:
        return IndexedSource(kind="hub")
    sig = file_signature(path)
    return IndexedSource(kind=source_kind(sources, source), path=str(path), size=sig.size,
                         mtime_ns=sig.mtime_ns, head_tail=sig.head_tail)  # fmt: skip


def _sig(s: IndexedSource) -> FileSignature:
    return FileSignature(s.size, s.mtime_ns, s.head_tail)


@dataclass(slots=True)
class PlanIndex:
    """A valid index of the plan of these sources."""

    rd: RunDir
    sources: SourceSet
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


def open_index(rd: RunDir, sources: SourceSet, limit: int | None) -> tuple[PlanIndex | None, str]:
    """The plan index when it is valid for ``sources`` and ``limit`` (module docstring), else
    (None, why not)."""
    rec, why = _read_record(rd)
    if rec is None:
        return None, why
    keys = index_keys(sources)
    if rec.key != index_key(keys):
        changed = sorted(k for k in keys.keys() | rec.keys.keys() if keys.get(k) != rec.keys.get(k))
        what = {"sources": "the sources' definitions", "dedup": "the dedup settings",
                "native_check": "the native check's tokenizer", "regen": "regen's version",
                "format": "the index format"}  # fmt: skip
        return None, "changed since it was written: " + ", ".join(what.get(k, k) for k in changed)
    if not rec.complete and (limit is None or rec.limit is None or limit > rec.limit):
        want = "all samples" if limit is None else f"--limit {limit}"
        return None, f"it holds the first {rec.limit} samples and this session plans {want}"
    for i, s in enumerate(sources.sources):
        got = rec.sources.get(s.name)
        kind = source_kind(sources, s)
        if got is None or got.kind != kind:
            return None, f"source {s.name!r} is not in it as a {kind} source"
        path = sources.local_file(s)
        if path is None:  # a hub dataset
            continue
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
    return PlanIndex(rd, sources, rec, table), ""


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


def invalidate(rd: RunDir, why: str) -> None:
    """Delete plan/index.json: the next session reads the sources and writes it again."""
    try:
        rd.delete(layout.PLAN_INDEX)
    except (OSError, RegenError) as e:
        log.warning("could not delete %s (%s)", layout.PLAN_INDEX, e)
    log.warning("%s deleted: %s", layout.PLAN_INDEX, why)
