"""RunDir over local paths, file:// URIs and pyarrow's in-memory filesystem."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from regen.store import RunDir


@pytest.fixture(params=["path", "uri", "memory"])
def rd(request, tmp_path) -> RunDir:
    if request.param == "path":
        return RunDir.open(tmp_path / "run")
    if request.param == "uri":
        return RunDir.open(f"file://{tmp_path}/run")
    return RunDir(pafs._MockFileSystem(), "/run", "mock:///run")


def test_json_roundtrip_and_listing(rd: RunDir) -> None:
    rd.makedirs("")
    assert rd.read_json("a.json") is None
    assert not rd.exists("a.json")
    rd.write_json_atomic("a.json", {"x": 1, "s": "é"})
    rd.write_json_atomic("sub/b.json", {"y": [1, 2]})
    rd.write_json_atomic("a.json", {"x": 2})
    assert rd.read_json("a.json") == {"x": 2}
    assert rd.read_json("sub/b.json") == {"y": [1, 2]}
    assert rd.exists("sub/b.json")
    assert rd.list("") == ["a.json", "sub"]
    assert rd.list("sub") == ["b.json"]
    assert rd.list("missing") == []


def test_half_written_json_reads_as_none(rd: RunDir) -> None:
    rd.makedirs("")
    rd.write_bytes_atomic("p.json", b'{"cut": ')
    assert rd.read_json("p.json") is None


def test_delete_and_move(rd: RunDir) -> None:
    rd.makedirs("d")
    rd.write_text_atomic("d/x.txt", "hello")
    rd.move("d/x.txt", "d/y.txt")
    assert rd.list("d") == ["y.txt"]
    assert rd.read_text("d/y.txt") == "hello"
    rd.delete("d/y.txt")
    rd.delete("d/y.txt")
    assert rd.list("d") == []
