"""source_set: the one cut of a manifest that the readers, planning and the plan index take."""

from __future__ import annotations

from pathlib import Path

from _sources_helpers import manifest_for

from regen.sources import NativeTarget, source_set


def test_local_files_resolved_hub_datasets_none_and_fields_named(tmp_path: Path) -> None:
    m = manifest_for(tmp_path, [
        {"name": "a", "adapter": "sharegpt", "path": "data/a.jsonl"},
        {"name": "h", "adapter": "sharegpt", "hub": {"id": "org/x"}},
    ])  # fmt: skip
    s = source_set(m)
    assert s.sources == tuple(m.sources) and s.dedup == m.dedup
    assert s.paths == (tmp_path.resolve() / "data" / "a.jsonl", None)
    assert s.base_dir == tmp_path.resolve()
    assert [s.field(x) for x in s.sources] == ["sources.0.path", "sources.1.hub"]
    assert s.source("h").hub is not None and s.local_file(s.source("a")) == s.paths[0]
    assert s.native is None  # no native source: no tokenizer to check rows against


def test_a_native_source_brings_the_target_tokenizer_it_is_checked_against(
    tmp_path: Path,
) -> None:
    m = manifest_for(tmp_path, [
        {"name": "a", "adapter": "sharegpt", "path": "a.jsonl"},
        {"name": "n", "adapter": "kimi_native", "mode": "native", "path": "n.jsonl"},
    ])  # fmt: skip
    assert source_set(m).native == NativeTarget(tmp_path.resolve() / "no-such-dir", None, False)
