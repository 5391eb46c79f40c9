"""Manifest validation: each kind of mistake gives one clear message naming the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from regen.core.errors import ConfigError, RegenError, SourceError
from regen.core.sample import stable_hash
from regen.manifest import ADAPTERS, load_manifest
from regen.quality import DEFAULT_DROP_FLAGS, FLAGS
from regen.sources import read_samples, source_set

REPO = Path(__file__).resolve().parents[1]

BASE: dict[str, Any] = {
    "name": "t",
    "target": {"model": "m", "tokenizer": "tok"},
    "sampling": {"temperature": 0.6},
    "sources": [
        {"name": "a", "adapter": "magicoder", "path": "a.jsonl"},
        {"name": "b", "adapter": "sharegpt", "path": "b.jsonl", "limit": 5},
    ],
}


def write(tmp: Path, data: dict[str, Any]) -> Path:
    (tmp / "a.jsonl").write_text('{"instruction": "q", "response": "r"}\n')
    (tmp / "b.jsonl").write_text('{"conversations": [{"from": "human", "value": "hi"}]}\n')
    p = tmp / "m.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def load_and_read(path: Path, overrides: list[str] | None = None) -> None:
    list(read_samples(source_set(load_manifest(path, overrides))))


def _set(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    d = copy.deepcopy(data)
    node: Any = d
    *head, last = dotted.split(".")
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node[k]
    node[int(last) if isinstance(node, list) else last] = value
    return d


@pytest.mark.parametrize(
    ("change", "error", "expect"),
    [
        (
            lambda d: _set(d, "sampling.temprature", 0.5),
            ConfigError,
            "sampling.temprature: unknown key",
        ),
        (
            lambda d: _set(d, "sources.1.colour", "red"),
            ConfigError,
            "sources.1.colour (source 'b'): unknown key",
        ),
        (
            lambda d: _set(d, "sampling.max_tokens", "lots"),
            ConfigError,
            "sampling.max_tokens: Input should be a valid integer",
        ),
        (
            lambda d: _set(d, "sources.1.name", "a"),
            ConfigError,
            "sources: Value error, duplicate source name 'a'",
        ),
        (
            lambda d: _set(d, "sources.1.path", "gone.jsonl"),
            SourceError,
            "source 'b': sources.1.path: file not found",
        ),
        (
            lambda d: _set(d, "sources.1.limit", -1),
            ConfigError,
            "sources.1.limit (source 'b'): Input should be greater than or equal to 0 (got -1)",
        ),
        (
            lambda d: _set(d, "sources.0.adapter", "csv"),
            ConfigError,
            "sources.0.adapter (source 'a'): Input should be",
        ),
        (
            lambda d: _set(d, "sources.0.turns", "first"),
            ConfigError,
            "sources.0.turns (source 'a'): Input should be 'all' or 'last'",
        ),
        (
            lambda d: {k: v for k, v in d.items() if k != "target"},
            ConfigError,
            "target: Field required",
        ),
    ],
    ids=[
        "unknown-key",
        "unknown-source-key",
        "wrong-type",
        "duplicate-source",
        "missing-file",
        "negative-limit",
        "unknown-adapter",
        "bad-turns",
        "missing-section",
    ],
)
def test_manifest_errors_name_the_field(
    tmp_path: Path, change: Any, error: type[RegenError], expect: str
) -> None:
    path = write(tmp_path, change(BASE))
    with pytest.raises(error) as e:
        load_and_read(path)
    msg = str(e.value)
    assert expect in msg
    assert "\n" not in msg


def test_valid_manifest_resolves_paths_against_its_folder(tmp_path: Path) -> None:
    m = load_manifest(write(tmp_path, BASE))
    assert m.resolve("a.jsonl") == tmp_path / "a.jsonl"
    assert [s.name for s in m.sources] == ["a", "b"]


def test_overrides_apply_by_name_and_index(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    m = load_manifest(path, ["sampling.temperature=0", "sources.b.limit=3", "sources.0.limit=1"])
    assert m.sampling.temperature == 0.0
    assert (m.source("b").limit, m.source("a").limit) == (3, 1)
    m2 = load_manifest(path, ["sources.a.output_tokens=[10, 20]"])
    assert m2.source("a").output_tokens == (10, 20)


@pytest.mark.parametrize(
    ("override", "expect"),
    [
        ("sampling.temperature=hot", "sampling.temperature: Input should be a valid number"),
        ("sampling.temperature=5", "sampling.temperature: Input should be less than or equal to 2"),
        ("sources.b.limit=-3", "sources.1.limit (source 'b'): Input should be greater than"),
        ("sources.nope.limit=3", "override 'sources.nope.limit': no list element 'nope'"),
        ("sampling.colour=1", "sampling.colour: unknown key"),
        ("sampling", "override 'sampling' is neither key=value nor a YAML file"),
        ("dedup.threshold=0.3", "dedup.threshold: Input should be greater than or equal to 0.5"),
        ("dedup.threshold=1.5", "dedup.threshold: Input should be less than or equal to 1"),
        ("dedup.shingle=0", "dedup.shingle: Input should be greater than or equal to 1"),
        ("dedup.near=maybe", "dedup.near: Input should be a valid boolean"),
        ("dedup.exact=false", "dedup.exact: unknown key"),
    ],
)
def test_overrides_validated_like_the_file(tmp_path: Path, override: str, expect: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_manifest(write(tmp_path, BASE), [override])
    assert expect in str(e.value)


@pytest.mark.parametrize("name", ["demo.yaml", "kimi-k25-eagle3.yaml"])
def test_bundled_manifests_validate(name: str) -> None:
    m = load_manifest(REPO / "manifests" / name)
    assert [s.adapter for s in m.sources] == list(ADAPTERS)  # one source of each
    assert m.sources[-1].mode == "native"
    assert m.source("swe_gym").turns == "last"


def test_production_manifest_mix() -> None:
    m = load_manifest(REPO / "manifests" / "kimi-k25-eagle3.yaml")
    limits = {s.name: s.limit for s in m.sources}
    assert limits == {
        "sharegpt": 15000,
        "ultrachat": 15000,
        "openthoughts": 10000,
        "perfectblend": 15000,
        "opencodereasoning": 8000,
        "xlam": 5000,
        "glaive": 4288,
        "swe_gym": 6000,
        "magicoder": 5000,
        "kimi_native": 4800,
    }
    assert sum(v for v in limits.values() if v) == 88088
    assert m.target.trust_remote_code and m.sampling.thinking
    assert all(s.hub is not None for s in m.sources[:-1]) and m.sources[-1].path is not None


def test_reference_documents_every_field() -> None:
    from regen import manifest as mf

    doc = (REPO / "docs" / "manifest.md").read_text()
    models = [mf.Manifest, mf.Target, mf.Sampling, mf.Endpoint, mf.Engine, mf.Source, mf.HubRef]
    models += [mf.Filters, mf.Dedup, mf.Export, mf.QualityConfig]
    missing = [f"{m.__name__}.{f}" for m in models for f in m.model_fields if f"`{f}`" not in doc]
    assert missing == []


def test_overlay_file_merges_by_source_name(tmp_path: Path) -> None:
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(
        "sources:\n  b:\n    limit: 4\n  a:\n    filters: {max_turns: 2}\n"
        "sampling:\n  temperature: 0\n"
    )
    m = load_manifest(write(tmp_path, BASE), [str(overlay), "sources.a.limit=1"])
    assert (m.source("b").limit, m.source("a").limit) == (4, 1)
    assert m.source("a").filters.max_turns == 2 and m.sampling.temperature == 0.0


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("sources:\n  nope:\n    limit: 3\n", "override 'sources.nope': no list element 'nope'"),
        (
            "sources:\n  b:\n    limit: -1\n",
            "sources.1.limit (source 'b'): Input should be greater",
        ),
        ("sampling:\n  colour: 1\n", "sampling.colour: unknown key"),
        ("- 1\n", "expected a mapping at top level"),
        ("sources: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_overlay_files_fail_like_the_manifest(tmp_path: Path, text: str, expect: str) -> None:
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_manifest(write(tmp_path, BASE), [str(overlay)])
    assert expect in str(e.value)


def test_token_ids_default_to_the_servers_stream_and_old_key_is_read() -> None:
    from regen.manifest import Sampling

    assert Sampling().token_ids == "stream"
    assert Sampling.model_validate({"server_token_ids": True}).token_ids == "nonstream"
    assert Sampling.model_validate({"server_token_ids": False}).token_ids == "local"
    with pytest.raises(ValueError):
        Sampling.model_validate({"token_ids": "sometimes"})


def test_dedup_defaults_and_fingerprint(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    m = load_manifest(path)
    assert (m.dedup.near, m.dedup.threshold, m.dedup.shingle, m.dedup.num_perm) == (
        True,
        0.85,
        5,
        128,
    )
    fps = {
        load_manifest(path, o).fingerprint()
        for o in (
            [],
            ["dedup.near=false"],
            ["dedup.threshold=0.9"],
            ["dedup.shingle=3"],
            ["dedup.num_perm=256"],
        )
    }
    assert len(fps) == 5  # every dedup setting is part of the fingerprint
    assert load_manifest(path, ["engine.workers=7"]).fingerprint() == m.fingerprint()
    # near off: the settings do nothing, and the fingerprint is the one from before dedup existed
    off = load_manifest(path, ["dedup.near=false"])
    assert load_manifest(path, ["dedup.near=false", "dedup.threshold=0.9"]).fingerprint() == (
        off.fingerprint()
    )
    before = {k: off.model_dump(mode="json")[k] for k in ("target", "sampling", "sources")}
    # a target of no known family (its tokenizer is not there) or a Kimi one: the payload
    # from before families (tests/targets/test_family_fingerprint.py)
    del before["target"]["family"], before["target"]["chat_template"]  # fields added since
    assert off.fingerprint() == stable_hash(before, n=32)


def test_changed_dedup_refuses_a_resume_unless_forced(tmp_path: Path) -> None:
    from regen.core.errors import FingerprintMismatchError
    from regen.store import RunDir, layout
    from regen.store.run import prepare_run

    path = write(tmp_path, BASE)
    rd = RunDir.open(tmp_path / "run")
    first = prepare_run(rd, load_manifest(path), [])
    assert prepare_run(rd, load_manifest(path), []).fingerprint == first.fingerprint
    changed = load_manifest(path, ["dedup.threshold=0.9"])
    with pytest.raises(FingerprintMismatchError):
        prepare_run(rd, changed, [])
    with pytest.raises(FingerprintMismatchError):
        prepare_run(rd, load_manifest(path, ["dedup.near=false"]), [])
    forced = prepare_run(rd, changed, [], force=True)
    assert forced.fingerprint == changed.fingerprint() != first.fingerprint
    assert forced.previous_fingerprints == [first.fingerprint]
    assert "threshold: 0.9" in rd.read_text(layout.MANIFEST)  # the resolved manifest has it


def test_a_run_made_before_near_dup_resumes_with_near_off(tmp_path: Path) -> None:
    from regen.core.errors import FingerprintMismatchError
    from regen.store import RunDir, layout
    from regen.store.run import prepare_run

    path = write(tmp_path, BASE)
    old = load_manifest(path, ["dedup.near=false"])
    rd = RunDir.open(tmp_path / "run")
    before = {k: old.model_dump(mode="json")[k] for k in ("target", "sampling", "sources")}
    # the manifest of that time had no family nor chat_template
    del before["target"]["family"], before["target"]["chat_template"]
    old_fp = stable_hash(before, n=32)
    layout.RUN_FILE.write(
        rd,
        layout.RunRecord(
            name="t", fingerprint=old_fp, model="m", created_at=0.0, regen_version="0.1.0"
        ),
    )
    with pytest.raises(FingerprintMismatchError):  # the new default would drop samples
        prepare_run(rd, load_manifest(path), [])
    assert prepare_run(rd, old, []).fingerprint == old_fp


def test_quality_thresholds_and_drop_flags_are_not_fingerprinted(tmp_path: Path) -> None:
    from regen.store import RunDir
    from regen.store.run import prepare_run

    path = write(tmp_path, BASE)
    rd = RunDir.open(tmp_path / "run")
    first = prepare_run(rd, load_manifest(path), [])
    other = load_manifest(path, ["quality.repeat_min_words=64", "export.drop_flags=all"])
    assert other.quality.repeat_min_words == 64
    assert other.export.drop_flags == list(FLAGS)
    assert prepare_run(rd, other, []).fingerprint == first.fingerprint  # resumes as it is


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("repetition,refusal", ["repetition", "refusal"]),
        ("refusal, repetition", ["repetition", "refusal"]),  # always in FLAGS order
        ("none", []),
        ("", []),
        ("default", list(DEFAULT_DROP_FLAGS)),
        ("default,refusal", [f for f in FLAGS if f in {*DEFAULT_DROP_FLAGS, "refusal"}]),
    ],
)
def test_export_drop_flags_parse(tmp_path: Path, value: str, want: list[str]) -> None:
    path = write(tmp_path, BASE)
    assert load_manifest(path, [f"export.drop_flags={value}"]).export.drop_flags == want


def test_bad_quality_settings_name_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    with pytest.raises(ConfigError, match=r"drop_flags.*unknown flag 'loops'"):
        load_manifest(path, ["export.drop_flags=repetition,loops"])
    with pytest.raises(ConfigError, match="quality"):
        load_manifest(path, ["quality.compression_max=2"])
    with pytest.raises(ConfigError, match="quality"):
        load_manifest(path, ["quality.typo=1"])


def _rename(data: dict[str, Any], dotted: str, new: str) -> dict[str, Any]:
    d = copy.deepcopy(data)
    node: Any = d
    *head, last = dotted.split(".")
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node[k]
    node[new] = node.pop(last)
    return d


@pytest.mark.parametrize(
    ("old", "new", "expect"),
    [
        ("sources.0.adapter", "adaptor",
         "sources.0.adaptor (source 'a'): unknown key (not allowed here); did you mean 'adapter'?"),
        ("target.tokenizer", "tokeniser",
         "target.tokeniser: unknown key (not allowed here); did you mean 'tokenizer'?"),
        ("name", "nmae", "nmae: unknown key (not allowed here); did you mean 'name'?"),
    ],
)  # fmt: skip
def test_a_misspelt_key_is_reported_before_the_field_it_leaves_missing(
    tmp_path: Path, old: str, new: str, expect: str
) -> None:
    path = write(tmp_path, _rename(BASE, old, new))
    with pytest.raises(ConfigError) as e:
        load_manifest(path)
    assert f"{path}: {expect}" in str(e.value)
    assert "Field required" not in str(e.value)


def test_an_unknown_key_far_from_every_name_gets_no_guess(tmp_path: Path) -> None:
    path = write(tmp_path, _set(BASE, "sampling.zzzzzz", 1))
    with pytest.raises(ConfigError) as e:
        load_manifest(path)
    assert str(e.value).endswith("sampling.zzzzzz: unknown key (not allowed here)")
