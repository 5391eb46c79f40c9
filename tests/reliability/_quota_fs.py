"""A local filesystem with a size limit, as a pyarrow filesystem: a disk that fills up.

``QuotaDisk(root, capacity)`` counts the bytes of the files under ``root`` (deletes free space)
and raises ``OSError(ENOSPC)`` from a write that would pass ``capacity``, after writing what
still fits (as a real full disk does). ``disk.rundir(path)`` is a RunDir on it; raise
``disk.capacity`` to "free space".
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from regen.store import RunDir


class _Writer:
    """A file object that stops at the disk's capacity."""

    def __init__(self, disk: QuotaDisk, path: str) -> None:
        self.disk = disk
        self.f = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.closed = False

    def write(self, data: Any) -> int:
        data = bytes(data)
        room = max(0, self.disk.capacity - self.disk.used)
        part = data[:room]
        self.f.write(part)
        self.f.flush()
        self.disk.used += len(part)
        if len(part) < len(data):
            self.disk.full_errors += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return len(data)

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        if not self.closed:
            self.f.close()
            self.closed = True

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.f.tell()


class QuotaDisk(pafs.FileSystemHandler):
    """Local files below ``root`` with at most ``capacity`` bytes in all."""

    def __init__(self, root: Path, capacity: int) -> None:
        self.root = root
        self.capacity = capacity
        self.full_errors = 0
        self.local = pafs.LocalFileSystem()
        root.mkdir(parents=True, exist_ok=True)
        self.used = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())

    def rundir(self, path: Path) -> RunDir:
        rd = RunDir(pafs.PyFileSystem(self), str(path), str(path))
        rd.makedirs("")
        return rd

    def _size(self, path: str) -> int:
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            return 0

    # -- the FileSystemHandler interface --------------------------------------------------------
    def get_type_name(self) -> str:
        return "quota"

    def equals(self, other: Any) -> bool:
        return other is self

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.local.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.local.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("not supported")

    def delete_file(self, path: str) -> None:
        size = self._size(path)
        self.local.delete_file(path)
        self.used -= size

    def move(self, src: str, dest: str) -> None:
        self.used -= self._size(dest)  # a replaced file frees its space
        self.local.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        raise OSError("not supported")

    def open_input_stream(self, path: str) -> Any:
        return self.local.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.local.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any = None) -> Any:
        self.used -= self._size(path)  # truncated
        return pa.PythonFile(_Writer(self, path), mode="w")

    def open_append_stream(self, path: str, metadata: Any = None) -> Any:
        raise OSError("not supported")

    def normalize_path(self, path: str) -> str:
        return path
