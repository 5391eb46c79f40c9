"""Raw rows: JSONL per-row rejections, Parquet batches, missing files, the hub failing fast."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _sources_helpers import manifest_for, write_jsonl

from regen.core.errors import SourceError
from regen.core.sample import Rejection
from regen.sources import RawRow, iter_raw, reader, source_set


def test_jsonl_rows_numbered_by_line_with_per_row_rejections(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "a.jsonl",
        [
            {"k": 1},
            b"",  # blank line: skipped, still counted as a line
            b'{"k": 2',
            b'{"k": "caf\xe9"}',
            b"[1, 2]",
            {"k": 3},
        ],
    )
    m = manifest_for(tmp_path, [{"name": "a", "adapter": "sharegpt", "path": path.name}])
    out = list(iter_raw(source_set(m), m.sources[0]))
    assert out[0] == RawRow(1, {"k": 1})
    assert [(r.row, r.reason) for r in out[1:4] if isinstance(r, Rejection)] == [
        (3, "malformed_json"),
        (4, "invalid_utf8"),
        (5, "malformed_json"),
    ]
    assert out[4] == RawRow(6, {"k": 3})
    assert len(out) == 5
    assert all(r.source == "a" for r in out[1:4] if isinstance(r, Rejection))


def test_jsonl_overlong_line_is_rejected_without_losing_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "MAX_ROW_BYTES", 64)
    path = write_jsonl(tmp_path / "a.jsonl", [{"v": "x" * 300}, {"v": "ok"}])
    m = manifest_for(tmp_path, [{"name": "a", "adapter": "sharegpt", "path": path.name}])
    out = list(iter_raw(source_set(m), m.sources[0]))
    assert isinstance(out[0], Rejection) and (out[0].row, out[0].reason) == (1, "too_long")
    assert out[1] == RawRow(2, {"v": "ok"})


def test_parquet_rows_stream_in_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "PARQUET_BATCH_ROWS", 3)
    rows = [{"instruction": f"q{i}", "response": f"a{i}"} for i in range(7)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    m = manifest_for(tmp_path, [{"name": "m", "adapter": "magicoder", "path": "m.parquet"}])
    out = list(iter_raw(source_set(m), m.sources[0]))
    assert out == [RawRow(i + 1, r) for i, r in enumerate(rows)]


def test_missing_file_names_source_and_field(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "ok.jsonl", [{"instruction": "q"}])
    m = manifest_for(
        tmp_path,
        [
            {"name": "ok", "adapter": "magicoder", "path": "ok.jsonl"},
            {"name": "gone", "adapter": "magicoder", "path": "nope.jsonl"},
        ],
    )
    assert len(list(iter_raw(source_set(m), m.sources[0]))) == 1
    with pytest.raises(SourceError) as e:
        list(iter_raw(source_set(m), m.sources[1]))
    assert e.value.source == "gone"
    assert "sources.1.path" in str(e.value) and "nope.jsonl" in str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_file_type(tmp_path: Path) -> None:
    (tmp_path / "rows.csv").write_text("a,b\n")
    m = manifest_for(tmp_path, [{"name": "c", "adapter": "magicoder", "path": "rows.csv"}])
    with pytest.raises(SourceError, match=r"sources\.0\.path: unknown file type '\.csv'"):
        list(iter_raw(source_set(m), m.sources[0]))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_hub_fails_fast_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    m = manifest_for(
        tmp_path, [{"name": "sg", "adapter": "sharegpt", "hub": {"id": "org/ds", "split": "train"}}]
    )
    import datasets

    asked: list[str] = []  # the hub client retries for ~25 s: it must not even be asked
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: asked.append(a[0]))
    with pytest.raises(SourceError) as e:
        list(iter_raw(source_set(m), m.sources[0]))
    assert asked == []
    msg = str(e.value)
    assert msg.startswith("source 'sg': sources.0.hub: hub dataset 'org/ds' is unreachable")
    assert "\n" not in msg


def test_offline_mode_skips_the_probe_and_still_fails_fast(tmp_path: Path) -> None:
    """HF_HUB_OFFLINE=1 (read by the hub client at import: hence a subprocess) with nothing
    cached: a one-line SourceError, quickly, and no connection attempt to the endpoint."""
    code = (
        "from regen.manifest import parse_manifest\n"
        "from regen.sources import iter_raw, source_set\n"
        "m = parse_manifest({'name': 'x', 'target': {'model': 'm', 'tokenizer': 't'},"
        " 'sources': [{'name': 'sg', 'adapter': 'sharegpt', 'hub': {'id': 'org/not-cached'}}]})\n"
        "try:\n"
        "    list(iter_raw(source_set(m), m.sources[0]))\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    line = out.stdout.strip()
    assert line.startswith("SourceError source 'sg': sources.0.hub: hub dataset 'org/not-cached'")
    assert "unreachable: cannot connect" not in line  # no probe when offline
    assert "\n" not in line
