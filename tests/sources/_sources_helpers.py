"""Shared helpers for the sources tests: tiny manifests over rows written to temp files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from regen.manifest import Manifest, parse_manifest


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """Rows as JSONL; ``bytes`` rows are written verbatim (for broken lines)."""
    with path.open("wb") as f:
        for r in rows:
            line = r if isinstance(r, bytes) else json.dumps(r, ensure_ascii=False).encode()
            f.write(line.rstrip(b"\n") + b"\n")
    return path


def manifest_for(tmp: Path, sources: list[dict[str, Any]]) -> Manifest:
    """A minimal valid manifest whose sources live under ``tmp``."""
    return parse_manifest(
        {"name": "t", "target": {"model": "m", "tokenizer": "no-such-dir"}, "sources": sources},
        base_dir=tmp,
    )


def one_source(tmp: Path, adapter: str, rows: list[Any], **extra: Any) -> Manifest:
    path = write_jsonl(tmp / f"{adapter}.jsonl", rows)
    src = {"name": adapter, "adapter": adapter, "path": str(path), **extra}
    if adapter == "kimi_native":
        src.setdefault("mode", "native")
    return manifest_for(tmp, [src])
