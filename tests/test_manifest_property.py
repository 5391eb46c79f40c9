"""The manifest loader on random YAML (issue 42, item 2): any bytes, any YAML tree, and the demo
manifest with hostile mutations give a manifest or one ``ConfigError`` of one line, never
another exception; ``-o`` overrides and overlay files alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from _hostile import hostile_value, mutated
from hypothesis import given
from hypothesis import strategies as st

from regen.core.errors import ConfigError
from regen.manifest import Manifest, load_manifest

DEMO = Path(__file__).resolve().parents[1] / "manifests" / "demo.yaml"
DEMO_TREE = yaml.safe_load(DEMO.read_text(encoding="utf-8"))

#: YAML that PyYAML reads into values of its own: dates (some impossible), anchors, tags,
#: merge keys, complex keys, deep nesting, tabs, a BOM, a document separator
ODD_YAML = (
    "name: 2001-02-30\n",
    "name: 2001-13-01T00:00:00\n",
    "a: &x 1\nb: *x\n",
    "a: *nope\n",
    "? [a, b]\n: c\n",
    "<<: {name: x}\n",
    "name: !!binary aGk=\n",
    "name: !!python/name:os.system\n",
    "[" * 200 + "]" * 200,
    "\ufeffname: x\n",
    "name:\tx\n",
    "---\nname: a\n---\nname: b\n",
    "sources: [{name: a, adapter: sharegpt, path: 2001-02-30}]\n",
    "name: .inf\n",
    "{{",
    "target: {model: 1e999, tokenizer: null}\n",
    "1: 2\n",
    "null\n",
    "",
)


def check(path: Path, overrides: list[str] | None = None) -> Manifest | None:
    try:
        return load_manifest(path, overrides)
    except ConfigError as e:
        message = str(e)
        assert message and "\n" not in message, message
        return None


@given(
    st.one_of(
        st.binary(max_size=200),
        st.sampled_from(ODD_YAML).map(str.encode),
        st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    )
)
def test_any_bytes(tmp_path_factory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("m") / "m.yaml"
    path.write_bytes(data)
    check(path)


@given(hostile_value())
def test_any_yaml_tree(tmp_path_factory, tree: Any) -> None:
    path = tmp_path_factory.mktemp("m") / "m.yaml"
    path.write_text(yaml.safe_dump(tree), encoding="utf-8")
    check(path)


@given(mutated(DEMO_TREE))
def test_the_demo_manifest_mutated(tmp_path_factory, tree: Any) -> None:
    path = tmp_path_factory.mktemp("m") / "demo.yaml"
    path.write_text(yaml.safe_dump(tree, allow_unicode=False), encoding="utf-8")
    check(path)


KEYS = [
    "name",
    "target.model",
    "sampling.max_tokens",
    "sampling.temperature",
    "engine.workers",
    "sources.0.limit",
    "sources.sharegpt.path",
    "sources.9.adapter",
    "dedup.threshold",
    "export.max_length",
    "quality",
    "endpoints",
    "sources",
    "x.y.z",
    "",
    ".",
    "sources.99",
]


@given(
    st.lists(
        st.tuples(st.sampled_from(KEYS), st.sampled_from(ODD_YAML) | st.text(max_size=30)),
        max_size=3,
    )
)
def test_overrides(pairs: list[tuple[str, str]]) -> None:
    check(DEMO, [f"{k}={v}" for k, v in pairs])


@given(hostile_value())
def test_overlay_files(tmp_path_factory, tree: Any) -> None:
    overlay = tmp_path_factory.mktemp("o") / "overlay.yaml"
    overlay.write_text(yaml.safe_dump(tree), encoding="utf-8")
    check(DEMO, [str(overlay)])
