"""The holdout.jsonl format: write/read, bad lines named by line and field, N per source
interleaved, where --run looks, and a prompt from a sample's turn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _bench_common import TOOL, prompts

from regen.bench.prompts import per_source
from regen.core.errors import ConfigError
from regen.store.holdout import HOLDOUT_FILE, holdout_path, read_prompts, write_prompts


def test_write_then_read(tmp_path: Path) -> None:
    ps = prompts({"sharegpt": 2, "xlam": 2})
    path = tmp_path / HOLDOUT_FILE
    assert write_prompts(path, ps) == 4
    assert not list(tmp_path.glob(".tmp-*"))
    assert read_prompts(path) == ps
    line = json.loads(path.read_text().splitlines()[2])
    assert set(line) == {"source", "sample_id", "turn", "messages", "tools"}
    assert line["tools"] == [TOOL] and line["source"] == "xlam"


@pytest.mark.parametrize(
    ("line", "expect"),
    [
        ("{not json", ":2: not JSON"),
        (
            '{"source": "a", "sample_id": "a:1", "messages": []}',
            ":2: messages: List should have at least 1",
        ),
        ('{"source": "a", "sample_id": "a:1"}', ":2: messages: Field required"),
        (
            '{"source": "a", "sample_id": "a:1", "messages": [{"role": "robot", "content": "x"}]}',
            "role 'robot' is not one of",
        ),
        (
            '{"source": "a", "sample_id": "a:1", '
            '"messages": [{"role": "assistant", "content": "x"}]}',
            "nothing left to answer",
        ),
        (
            '{"source": "a", "sample_id": "a:1", '
            '"messages": [{"role": "user", "content": "x"}], "extra": 1}',
            ":2: extra: unknown key",
        ),
        (
            '{"source": "", "sample_id": "a:1", "messages": [{"role": "user", "content": "x"}]}',
            ":2: source",
        ),
    ],
)
def test_bad_lines_are_named(tmp_path: Path, line: str, expect: str) -> None:
    good = json.dumps(prompts({"a": 1})[0].model_dump(mode="json"))
    path = tmp_path / "p.jsonl"
    path.write_text(f"{good}\n{line}\n")
    with pytest.raises(ConfigError) as e:
        read_prompts(path)
    assert str(path) in str(e.value) and expect in str(e.value)


def test_empty_missing_and_undecodable_files(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ConfigError, match="has no prompts"):
        read_prompts(tmp_path / "empty.jsonl")
    with pytest.raises(ConfigError, match="cannot read prompts file"):
        read_prompts(tmp_path / "missing.jsonl")
    (tmp_path / "latin.jsonl").write_bytes(b'{"source": "\xe9"}\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_prompts(tmp_path / "latin.jsonl")


def test_per_source_takes_n_each_and_interleaves() -> None:
    ps = prompts({"a": 3, "b": 1, "c": 2})
    picked = per_source(ps, 2)
    assert [p.sample_id for p in picked] == ["a:0", "b:0", "c:0", "a:1", "c:1"]
    assert len(per_source(ps, None)) == 6
    with pytest.raises(ConfigError):
        per_source(ps, 0)


def test_holdout_path_in_the_run_or_the_export(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        holdout_path(tmp_path)
    assert "--holdout N" in str(e.value) and "--prompts FILE" in str(e.value)
    (tmp_path / "export").mkdir()
    write_prompts(tmp_path / "export" / HOLDOUT_FILE, prompts({"a": 1}))
    assert holdout_path(tmp_path) == tmp_path / "export" / HOLDOUT_FILE
    assert holdout_path(tmp_path / "export") == tmp_path / "export" / HOLDOUT_FILE
