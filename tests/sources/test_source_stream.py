"""read_samples: manifest order, filters, dedup within/across sources, limits, stable ids."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from _sources_helpers import manifest_for, write_jsonl

from regen.core.errors import SourceError
from regen.manifest import load_manifest
from regen.sources import ReadStats, iter_source, read_samples, source_set

DEMO = Path(__file__).resolve().parents[2] / "manifests" / "demo.yaml"


def conv(q: str, a: str = "ok") -> dict:
    return {"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}


def test_dedup_within_and_across_sources_first_wins(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [conv("one"), conv("two"), conv("one"), conv("  one ")])
    write_jsonl(
        tmp_path / "b.jsonl",
        [
            {
                "messages": [
                    {"role": "user", "content": "two"},
                    {"role": "assistant", "content": "ok"},
                ]
            },
            {"messages": [{"role": "user", "content": "three"}]},
        ],
    )
    m = manifest_for(
        tmp_path,
        [
            {"name": "a", "adapter": "sharegpt", "path": "a.jsonl"},
            {"name": "b", "adapter": "ultrachat", "path": "b.jsonl"},
        ],
    )
    stats = ReadStats()
    got = list(read_samples(source_set(m), stats))
    assert [(s.source, s.row) for s in got] == [("a", 1), ("a", 2), ("b", 2)]
    # the last row differs only in whitespace: normalized, it is a duplicate too
    assert (stats.sources["a"].duplicates, stats.sources["a"].kept) == (2, 2)
    assert (stats.sources["b"].duplicates, stats.sources["b"].kept) == (1, 1)
    assert stats.sources["b"].regenerate_turns == 1  # prompt-only sample: one request


def test_filters_and_limit_counted(tmp_path: Path) -> None:
    rows = [
        conv("x" * 50),
        conv("short"),
        {"conversations": [{"from": "human", "value": "abc"}, {"from": "gpt", "value": "b"}] * 3},
        conv("fine one"),
        conv("fine two"),
        conv("never read"),
    ]
    write_jsonl(tmp_path / "a.jsonl", rows)
    m = manifest_for(
        tmp_path,
        [
            {
                "name": "a",
                "adapter": "sharegpt",
                "path": "a.jsonl",
                "limit": 2,
                "filters": {"max_prompt_chars": 20, "min_prompt_chars": 6, "max_turns": 2},
            }
        ],
    )
    stats = ReadStats()
    got = list(read_samples(source_set(m), stats))
    st = stats.sources["a"]
    assert [s.row for s in got] == [4, 5]
    assert st.filtered == {"max_prompt_chars": 1, "min_prompt_chars": 1, "max_turns": 1}
    assert (st.read, st.kept, st.limit_reached) == (5, 2, True)


def test_limit_zero_reads_nothing_and_limited_source_does_not_block_dedup(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [conv("p"), conv("q")])
    write_jsonl(tmp_path / "b.jsonl", [conv("q")])
    m = manifest_for(
        tmp_path,
        [
            {"name": "z", "adapter": "sharegpt", "path": "a.jsonl", "limit": 0},
            {"name": "a", "adapter": "sharegpt", "path": "a.jsonl", "limit": 1},
            {"name": "b", "adapter": "sharegpt", "path": "b.jsonl"},
        ],
    )
    stats = ReadStats()
    got = [s.id.split(":")[0] for s in read_samples(source_set(m), stats)]
    assert got == ["a", "b"]  # "q" was never kept by a (limit), so b keeps it
    assert stats.sources["z"].read == 0


def test_repeated_upstream_id_with_other_content_is_disambiguated(tmp_path: Path) -> None:
    rows = [dict(conv("first"), id="x"), dict(conv("second"), id="x"), dict(conv("first"), id="x")]
    write_jsonl(tmp_path / "a.jsonl", rows)
    m = manifest_for(tmp_path, [{"name": "a", "adapter": "sharegpt", "path": "a.jsonl"}])
    ids = [s.id for s in iter_source(source_set(m), m.sources[0])]  # type: ignore[union-attr]
    # every row of a non-unique upstream id carries its content hash: order-independent
    assert ids[0] == ids[2] != ids[1]
    assert all(i.startswith("a:x#") and len(i) == len("a:x#") + 8 for i in ids)
    stats = ReadStats()
    assert [s.id for s in read_samples(source_set(m), stats)] == ids[:2]
    assert stats.sources["a"].duplicates == 1


def test_demo_ids_identical_across_runs_and_after_shuffling(tmp_path: Path) -> None:
    first = [s.id for s in read_samples(source_set(load_manifest(DEMO)))]
    again = [s.id for s in read_samples(source_set(load_manifest(DEMO)))]
    assert first == again and len(set(first)) == len(first)

    # shuffle every source file's lines (no source relies on order except for duplicates,
    # whose survivor is the same content either way)
    shutil.copytree(DEMO.parent / "demo", tmp_path / "demo")
    shutil.copy(DEMO, tmp_path / "demo.yaml")
    rng = random.Random(7)
    for f in sorted((tmp_path / "demo").glob("*.jsonl")):
        lines = f.read_bytes().splitlines(keepends=True)
        rng.shuffle(lines)
        f.write_bytes(b"".join(x if x.endswith(b"\n") else x + b"\n" for x in lines))
    shuffled = [s.id for s in read_samples(source_set(load_manifest(tmp_path / "demo.yaml")))]
    assert sorted(shuffled) == sorted(first)
    assert shuffled != first  # the order did change


def test_source_error_after_earlier_sources_were_yielded(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [conv("p")])
    m = manifest_for(
        tmp_path,
        [
            {"name": "a", "adapter": "sharegpt", "path": "a.jsonl"},
            {"name": "b", "adapter": "sharegpt", "path": "missing.jsonl"},
        ],
    )
    got = []
    with pytest.raises(SourceError, match=r"source 'b': sources\.1\.path: file not found"):
        for s in read_samples(source_set(m)):
            got.append(s.source)
    assert got == ["a"]
