"""Raw rows of one source: a local JSONL or Parquet file, or a Hugging Face hub dataset.

Reads only; owns no files. Rows are numbered from 1 in file order (JSONL: the line number, so a
person can open the file at that line; Parquet and hub: the row ordinal). A JSONL row also says
where its bytes are (``loc``: byte offset and length of its line), so the plan index can read it
again without reading the file (:mod:`regen.sources.locate`). Memory is bounded: JSONL
is read line by line (a line longer than ``MAX_ROW_BYTES`` is rejected as ``too_long`` without
being held whole), Parquet in record batches, hub datasets as a stream.

A row that cannot be decoded (invalid UTF-8, malformed JSON, not an object) is a
:class:`~regen.core.sample.Rejection`, and so is a row holding text that is not valid Unicode
(``invalid_unicode``: a lone surrogate from a JSON escape such as ``"\\ud800"``, in any field,
the field named; regen.core.sample says why such text is never passed on). A source that cannot be
read at all (missing file, unknown file type, unreachable hub id) raises
:class:`~regen.core.errors.SourceError` naming the source and the manifest field (``sources.N.path``
or ``sources.N.hub``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from regen.core import jsontext
from regen.core.errors import SourceError
from regen.core.sample import Rejection, unencodable_field
from regen.manifest import Source
from regen.sources.sourceset import SourceSet

log = logging.getLogger(__name__)

#: longest JSONL line accepted (bytes); longer lines are rejected as ``too_long``
MAX_ROW_BYTES = 16 * 1024 * 1024
#: rows per Parquet record batch
PARQUET_BATCH_ROWS = 512
#: seconds allowed to open a TCP connection to the hub before the source counts as unreachable
HUB_CONNECT_TIMEOUT_S = float(os.environ.get("REGEN_HUB_CONNECT_TIMEOUT_S", "5"))

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
#: a JSON escape of a UTF-16 surrogate: only a line holding one can decode to a lone surrogate
#: (strict UTF-8 decoding refuses encoded surrogates), so only such lines are walked
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
PARQUET_SUFFIXES = (".parquet", ".pq")


@dataclass(slots=True, frozen=True)
class RawRow:
    """One decoded row of a source, before any adapter looked at it."""

    row: int  #: 1-based position in the source (JSONL: line number)
    data: Mapping[str, object]
    #: JSONL: (byte offset, length) of the line (where the row is, not what it is)
    loc: tuple[int, int] | None = dataclasses.field(default=None, compare=False)


def iter_raw(sources: SourceSet, source: Source) -> Iterator[RawRow | Rejection]:
    """Every row of ``source`` (one of ``sources``) in order, decoded, or a rejection for a row
    that cannot be."""
    field = sources.field(source)
    path = sources.local_file(source)
    if path is not None:
        if not path.is_file():
            raise SourceError(source.name, f"{field}: file not found: {path}")
        name = path.name.lower()
        if name.endswith(JSONL_SUFFIXES):
            yield from _iter_jsonl(source.name, path)
        elif name.endswith(PARQUET_SUFFIXES):
            yield from _iter_parquet(source.name, field, path)
        else:
            raise SourceError(
                source.name, f"{field}: unknown file type {path.suffix!r} (use .jsonl or .parquet)"
            )
    else:
        yield from _iter_hub(source, field)


def _iter_jsonl(name: str, path: Path) -> Iterator[RawRow | Rejection]:
    with path.open("rb") as f:
        lineno = 0
        at = 0  # byte offset of the line
        while True:
            line = f.readline(MAX_ROW_BYTES + 1)
            if not line:
                return
            lineno += 1
            start, at = at, at + len(line)
            if len(line) > MAX_ROW_BYTES:
                while line and not line.endswith(b"\n"):  # skip the rest of the long line
                    line = f.readline(MAX_ROW_BYTES)
                    at += len(line)
                yield Rejection(name, lineno, "too_long", f"line longer than {MAX_ROW_BYTES} bytes")
                continue
            if not line.strip():
                continue
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                yield Rejection(name, lineno, "invalid_utf8", f"byte {e.start}: {e.reason}")
                continue
            try:
                data = jsontext.loads(text)
            except json.JSONDecodeError as e:
                yield Rejection(name, lineno, "malformed_json", f"{e.msg} (column {e.colno})")
                continue
            if not isinstance(data, dict):
                yield Rejection(
                    name, lineno, "malformed_json", f"expected an object, got {type(data).__name__}"
                )
                continue
            if _SURROGATE_ESCAPE.search(text) and (bad := invalid_unicode(name, lineno, data)):
                yield bad
                continue
            yield RawRow(lineno, data, (start, len(line)))


def invalid_unicode(name: str, row: int, data: Mapping[str, object]) -> Rejection | None:
    """The ``invalid_unicode`` rejection of a decoded row holding a lone surrogate, or None."""
    hit = unencodable_field(data)
    if hit is None:
        return None
    where, code = hit
    return Rejection(name, row, "invalid_unicode", f"lone surrogate {code}", where)


def _iter_parquet(name: str, field: str, path: Path) -> Iterator[RawRow]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        row = 0
        for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for data in batch.to_pylist():
                row += 1
                yield RawRow(row, data)
    except (OSError, ValueError) as e:  # pyarrow.ArrowException subclasses these
        raise SourceError(name, f"{field}: cannot read Parquet {path}: {_one_line(e)}") from None


def _iter_hub(source: Source, field: str) -> Iterator[RawRow | Rejection]:
    hub = source.hub
    assert hub is not None
    where = f"{field}: hub dataset {hub.id!r}"
    if not _hub_offline():
        _probe_hub(source.name, where)
    try:
        import datasets

        ds = datasets.load_dataset(
            hub.id, hub.config, split=hub.split, revision=hub.revision, streaming=True
        )
        for row, data in enumerate(ds, start=1):
            bad = invalid_unicode(source.name, row, dict(data))  # JSON files on the hub
            yield bad if bad is not None else RawRow(row, dict(data))
    except SourceError:
        raise
    except Exception as e:  # the hub stack raises many unrelated types; all mean "unreachable"
        raise SourceError(source.name, f"{where} cannot be read: {_one_line(e)}") from None


def _hub_offline() -> bool:
    """The hub client's own offline switch (HF_HUB_OFFLINE, read when it was imported)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _probe_hub(name: str, where: str) -> None:
    """Fail in seconds when the hub endpoint cannot be reached (the hub client retries ~25 s)."""
    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=HUB_CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        raise SourceError(
            name, f"{where} is unreachable: cannot connect to {host}:{port} ({_one_line(e)})"
        ) from None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 240 else text[:237] + "..."
