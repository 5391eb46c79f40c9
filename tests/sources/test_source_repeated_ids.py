"""Sample ids of rows whose upstream id repeats do not depend on the order of the source."""

from __future__ import annotations

import random
from pathlib import Path

from _sources_helpers import manifest_for, write_jsonl

from regen.core.sample import Sample
from regen.sources import source_set
from regen.sources.adapters import iter_source


def conv(text: str) -> dict:
    return {"conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "ok"}]}


def _ids(tmp_path: Path, rows: list[dict], adapter: str = "sharegpt") -> dict[str, str]:
    """content of the first user turn → sample id."""
    write_jsonl(tmp_path / "a.jsonl", rows)
    m = manifest_for(tmp_path, [{"name": "a", "adapter": adapter, "path": "a.jsonl"}])
    out = {}
    for s in iter_source(source_set(m), m.sources[0]):
        assert isinstance(s, Sample)
        out[s.messages[0].content] = s.id
    return out


def test_repeated_ids_survive_any_shuffle(tmp_path: Path) -> None:
    rows = [dict(conv(f"q{i}"), id=f"x{i % 3}") for i in range(9)]  # each id three times
    first = _ids(tmp_path, rows)
    assert len(set(first.values())) == 9
    rng = random.Random(11)
    for _ in range(5):
        shuffled = rows[:]
        rng.shuffle(shuffled)
        assert _ids(tmp_path, shuffled) == first  # the same row always gets the same id
    assert all(i.startswith("a:x") and len(i.split("#")[1]) == 8 for i in first.values())


def test_declared_unique_ids_stay_bare(tmp_path: Path) -> None:
    rows = [
        {"id": 7, "query": "Weather in Oslo?", "tools": "[]", "answers": "[]"},
        {"id": 8, "query": "Weather in Rome?", "tools": "[]", "answers": "[]"},
    ]
    assert sorted(_ids(tmp_path, rows, "xlam").values()) == ["a:7", "a:8"]
