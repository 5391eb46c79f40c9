"""RunDir: the run directory as a filesystem, over pyarrow.fs (local paths and URIs).

A run directory is a local path (``runs/demo``) or any URI pyarrow.fs understands
(``file:///abs/path``, ``s3://bucket/prefix?endpoint_override=host:port&scheme=http``, ...).
``RunDir`` only knows relative paths below that root and owns no files of its own: what lives
there is documented in :mod:`regen.store.layout`, the only module that names those files.

Every write of a whole file goes through :meth:`RunDir.atomic_writer`: the bytes go to a
temporary sibling (``.tmp-*``) that is then moved over the target, so a reader sees the old or
the new file, never half of one, and a failed write leaves nothing behind. On an object store,
where a read is two requests, :meth:`RunDir.read_bytes` keeps that promise by reading again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pyarrow.fs as pafs

from regen.core.errors import RunDirError
from regen.core.jsontext import JsonObject, JsonValue

log = logging.getLogger(__name__)

#: temporary names (:meth:`RunDir.atomic_writer`'s) start with this: never read, removed when
#: left over by a crash
TMP_PREFIX = ".tmp-"

#: pyarrow filesystems that are object stores
OBJECT_STORES = frozenset({"S3FileSystem", "GcsFileSystem", "AzureFileSystem"})


def public_uri(uri: str) -> str:
    """``uri`` as regen may print or write it: without user:password (pyarrow reads S3 keys
    from ``s3://KEY:SECRET@bucket/...``) and without key query parameters."""

    if "://" not in uri:
        return uri
    parts = urlsplit(uri)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
                       if k not in SECRET_PARAMS], safe=":/")  # fmt: skip
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


#: URI query parameters that carry credentials
SECRET_PARAMS = frozenset({"access_key", "secret_key", "session_token"})

#: reads of a file on an object store before one is not torn by a rewrite (see
#: :meth:`RunDir.read_bytes`)
TORN_READ_TRIES = 20


def _same(a: pafs.FileInfo, b: pafs.FileInfo) -> bool:
    """The same version of a file, as far as a listing tells: type, size and time."""
    return (a.type, a.size, a.mtime) == (b.type, b.size, b.mtime)


class RunDir:
    """A directory (local or remote) addressed by relative paths."""

    __slots__ = ("fs", "root", "uri")

    def __init__(self, fs: pafs.FileSystem, root: str, uri: str) -> None:
        self.fs = fs  #: the pyarrow filesystem
        self.root = root.rstrip("/") or "/"  #: root path inside ``fs``
        self.uri = uri  #: for messages: the URI the user gave, or a local path made absolute

    @classmethod
    def open(cls, uri: str | os.PathLike[str], *, create: bool = True) -> RunDir:
        """Open (and by default create) the run directory at a local path or pyarrow URI."""
        text = os.fspath(uri)
        if "://" in text:
            try:
                fs, root = pafs.FileSystem.from_uri(text)
            except (ValueError, OSError) as e:
                raise RunDirError(f"cannot open run directory {text!r}: {e}") from None
        else:  # a local path is named by its absolute path in every message
            fs, root = pafs.LocalFileSystem(), str(Path(text).expanduser().absolute())
            text = root
        rd = cls(fs, root, public_uri(text))
        if create:
            rd.create()
        return rd

    def create(self) -> None:
        """Create the directory (and its parents) if it does not exist."""
        try:
            self.fs.create_dir(self.root, recursive=True)
        except OSError as e:
            raise RunDirError(f"cannot create run directory {self.uri!r}: {e}") from None

    # -- paths ----------------------------------------------------------------------------
    def path(self, rel: str) -> str:
        """The filesystem path of ``rel`` (a '/'-separated path below the root)."""
        rel = rel.strip("/")
        return f"{self.root}/{rel}" if rel else self.root

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def is_object_store(self) -> bool:
        """An object store (S3, GCS, Azure): no append, no rename (a move is copy + delete)."""
        return type(self.fs).__name__ in OBJECT_STORES

    # -- queries ----------------------------------------------------------------------------
    def require(self) -> RunDir:
        """This run directory, when it is an existing directory (what a command that reads a
        run needs); else one :class:`RunDirError` line saying what the path is instead."""
        kind = self.fs.get_file_info(self.root).type
        if kind == pafs.FileType.NotFound:
            raise RunDirError(f"run directory {self.uri} does not exist")
        if kind != pafs.FileType.Directory:
            raise RunDirError(f"{self.uri} is a file, not a run directory")
        return self

    def exists(self, rel: str) -> bool:
        return bool(self.fs.get_file_info(self.path(rel)).type != pafs.FileType.NotFound)

    def list(self, rel_dir: str = "", *, include_temp: bool = False) -> list[str]:
        """Names (not paths) of the entries of ``rel_dir``, sorted; [] when it does not exist.

        Temporary files (``.tmp-*``) are left out unless ``include_temp``.
        """
        sel = pafs.FileSelector(self.path(rel_dir), allow_not_found=True, recursive=False)
        names = (info.base_name for info in self.fs.get_file_info(sel))
        return sorted(n for n in names if include_temp or not n.startswith(TMP_PREFIX))

    def sizes(self, rel_dir: str = "") -> dict[str, int]:
        """``{name: size in bytes}`` of the files of ``rel_dir`` (no temporary ones): one
        listing call, no file is opened."""
        sel = pafs.FileSelector(self.path(rel_dir), allow_not_found=True, recursive=False)
        return {
            i.base_name: int(i.size or 0)
            for i in self.fs.get_file_info(sel)
            if i.type == pafs.FileType.File and not i.base_name.startswith(TMP_PREFIX)
        }

    def size(self, rel: str) -> int:
        info = self.fs.get_file_info(self.path(rel))
        return info.size or 0

    def mtime(self, rel: str) -> float | None:
        """Modification time (epoch seconds) of ``rel``; None when missing or unknown."""
        info = self.fs.get_file_info(self.path(rel))
        if info.type == pafs.FileType.NotFound or info.mtime is None:
            return None
        stamp: float = info.mtime.timestamp()
        return stamp

    # -- bytes ------------------------------------------------------------------------------
    def read_bytes(self, rel: str) -> bytes | None:
        """The file's bytes, or None when it does not exist.

        On an object store a read can tear: pyarrow takes the size from one request and the
        bytes from a second, ranged one, so an object replaced in between reads as the first
        bytes of the new version (a progress.json cut short while ``regen status`` reads it).
        There the read is kept only when the object's size and time, looked up before and
        after, are the same and the bytes have that size; otherwise it is read again.
        """
        path = self.path(rel)
        if not self.is_object_store:
            return self._read(path)
        for _ in range(TORN_READ_TRIES):
            before = self.fs.get_file_info(path)
            if before.type == pafs.FileType.NotFound:
                return None
            data = self._read(path)
            after = self.fs.get_file_info(path)
            if data is not None and _same(before, after) and len(data) == after.size:
                return data
            log.debug("%s: %s changed while it was read; reading it again", self.uri, rel)
        raise RunDirError(f"{self.uri}: {rel} changed during each of {TORN_READ_TRIES} reads")

    def _read(self, path: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(path) as f:
                data: bytes = f.read()
                return data
        except FileNotFoundError:
            return None

    def read_text(self, rel: str) -> str | None:
        """``rel`` as UTF-8 text (None when missing; RunDirError when it is not UTF-8)."""
        data = self.read_bytes(rel)
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RunDirError(f"{rel} is damaged: not UTF-8 text (byte {e.start})") from None

    @contextlib.contextmanager
    def atomic_writer(self, rel: str) -> Iterator[IO[bytes]]:
        """A binary output stream for ``rel``: written under a temporary sibling name and moved
        over ``rel`` when the block ends without error. On any error the temporary file is
        removed and ``rel`` is untouched; an OSError becomes one RunDirError naming ``rel``."""
        parent, _, name = rel.strip("/").rpartition("/")
        if parent:
            self.makedirs(parent)
        tmp_name = f"{TMP_PREFIX}{uuid.uuid4().hex[:8]}-{name}"
        tmp = f"{parent}/{tmp_name}" if parent else tmp_name
        try:
            with self.fs.open_output_stream(self.path(tmp)) as f:
                yield f
            self.fs.move(self.path(tmp), self.path(rel))
        except BaseException as e:
            try:
                self.delete(tmp)
            except Exception as cleanup:  # keep the original error
                log.warning("could not remove %s: %s", tmp, cleanup)
            if isinstance(e, OSError):  # disk full, permissions, ...: one clear error
                raise RunDirError(f"{self.uri}: cannot write {rel}: {e}") from e
            raise

    def write_bytes_atomic(self, rel: str, data: bytes) -> None:
        """Write ``data`` to ``rel`` atomically (see :meth:`atomic_writer`)."""
        with self.atomic_writer(rel) as f:
            f.write(data)

    def write_text_atomic(self, rel: str, text: str) -> None:
        self.write_bytes_atomic(rel, text.encode("utf-8"))

    # -- JSON -------------------------------------------------------------------------------
    def read_json(self, rel: str) -> JsonObject | None:
        """The JSON object stored at ``rel``; None when missing or unreadable (half-written)."""
        data = self.read_bytes(rel)
        if data is None:
            return None
        try:
            obj: JsonValue = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            log.warning("%s: %s is not valid JSON; ignoring it", self.uri, rel)
            return None
        return obj if isinstance(obj, dict) else None

    def write_json_atomic(self, rel: str, obj: object) -> None:
        """Atomically replace ``rel`` with ``obj`` as JSON."""
        self.write_bytes_atomic(rel, json.dumps(obj, ensure_ascii=False, indent=1).encode())

    # -- housekeeping ---------------------------------------------------------------------
    def makedirs(self, rel: str) -> None:
        self.fs.create_dir(self.path(rel), recursive=True)

    def delete(self, rel: str) -> None:
        """Delete a file if it exists."""
        try:
            self.fs.delete_file(self.path(rel))
        except FileNotFoundError:
            pass
        except OSError as e:  # some filesystems report a missing file differently
            if self.exists(rel):
                raise RunDirError(f"{self.uri}: cannot delete {rel}: {e}") from None

    def move(self, src: str, dst: str) -> None:
        self.fs.move(self.path(src), self.path(dst))

    def __repr__(self) -> str:
        return f"RunDir({self.uri!r})"
