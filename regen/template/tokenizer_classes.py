"""The class ``AutoTokenizer`` picked for a tokenizer directory, remembered across processes.

``AutoTokenizer`` picks a directory's class from its files and its model config, and importing
it imports transformers' model configs and with them torch: loading the demo's tokenizer took
3.2 CPU-s that way and 1.3 by its class (2026-12-07), in every ``regen run``, ``regen plan``
and ``regen demo``, for a tokenizer that never touches a tensor. Once a process has resolved a
directory, :func:`remember` keeps the class's spec
(:func:`regen.template.tokenizer.class_spec`); a later process gets it from :func:`remembered`
and loads by it (:func:`regen.template.tokenizer.load_tokenizer`): the same tokenizer, without
torch, and a spec that no longer loads is resolved again.

The key is what the pick depends on: the directory's absolute path and :func:`dir_signature`
(the names, sizes and mtimes of its files; no file is read), the versions of transformers and
tokenizers, and whether the directory's own code may run. A file changed, added or removed, or
another transformers, and the class is resolved again.

Files, under :func:`cache_root` (``$REGEN_CACHE_DIR``, else ``$XDG_CACHE_HOME/regen``, else
``~/.cache/regen``; ``REGEN_CACHE_DIR`` set empty: no cache)::

    tokenizer-classes/
      <sha256 of the key>.txt    the spec, one line; written whole (a temporary file in the same
                                 folder, renamed over it), so a reader sees the old line or
                                 the new one

A cache that cannot be read or written is no error: the class is resolved as without one
(logged at debug level).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

log = logging.getLogger(__name__)

#: the environment variable naming the cache's folder (set empty: no cache)
CACHE_ENV = "REGEN_CACHE_DIR"
#: the folder of the remembered classes, below the cache's
CLASSES = "tokenizer-classes"


def dir_signature(path: str | os.PathLike[str]) -> str:
    """A hash of the names, sizes and mtimes of the files under ``path`` ("" if none)."""
    root = Path(path)
    items = []
    if root.is_dir():
        for p in sorted(root.rglob("*")):
            if p.is_file():
                st = p.stat()
                items.append(f"{p.relative_to(root)}\t{st.st_size}\t{st.st_mtime_ns}")
    return hashlib.sha256("\n".join([str(root), *items]).encode()).hexdigest() if items else ""


def cache_root() -> Path | None:
    """The cache's folder (module docstring); None when ``REGEN_CACHE_DIR`` is set empty."""
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        return Path(env).expanduser() if env else None
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "regen"


def class_entry(path: str | os.PathLike[str], trust_remote_code: bool) -> Path | None:
    """The file of the key of the directory at ``path`` as it is now (module docstring); None
    without a cache, or when the directory holds no file or cannot be listed."""
    root = cache_root()
    if root is None:
        return None
    try:
        signature = dir_signature(Path(path).resolve())
    except (OSError, RuntimeError) as e:
        log.debug("tokenizer directory %s not listed: %s", path, e)
        return None
    if not signature:
        return None
    key = "\n".join([signature, package_version("transformers"), package_version("tokenizers"),
                     str(bool(trust_remote_code))])  # fmt: skip
    return root / CLASSES / f"{hashlib.sha256(key.encode()).hexdigest()}.txt"


def remembered(entry: Path | None) -> str | None:
    """The spec kept in ``entry`` (:func:`class_entry`), else None."""
    if entry is None:
        return None
    try:
        spec = entry.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        log.debug("no remembered tokenizer class in %s: %s", entry, e)
        return None
    return spec or None


def remember(entry: Path | None, spec: str) -> None:
    """Keep ``spec`` in ``entry`` (:func:`class_entry`; None: nowhere)."""
    if entry is None:
        return
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=entry.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(spec + "\n")
        os.replace(tmp, entry)
        tmp = None
    except OSError as e:
        log.debug("tokenizer class not remembered in %s: %s", entry, e)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def package_version(package: str) -> str:
    """The installed version of ``package`` ("" when it is not installed)."""
    try:
        return version(package)
    except PackageNotFoundError:
        return ""
