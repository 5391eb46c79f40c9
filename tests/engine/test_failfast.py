"""The tokenizer and template checks are not repeated by a session whose configuration an
earlier session already checked (checks.json); any change to what they depend on repeats them."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from _runs import copy_demo

from regen.core.errors import ConfigError
from regen.engine import failfast as pf
from regen.engine.driver import _passed_checks
from regen.manifest import load_manifest
from regen.store import RunDir

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    return copy_demo(tmp_path)


def test_a_passed_key_skips_the_tokenizer_and_template(demo, monkeypatch, caplog) -> None:
    m = load_manifest(demo)
    checked = pf.preflight(m)
    assert checked.key == pf.checks_key(load_manifest(demo))  # stable

    def no_load(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("the tokenizer was loaded")

    monkeypatch.setattr("regen.template.render.Renderer.of", no_load)
    caplog.set_level(logging.INFO, logger="regen.engine.failfast")
    assert pf.preflight(m, passed=checked) is checked
    assert "not repeated" in caplog.text
    with pytest.raises(AssertionError, match="tokenizer was loaded"):
        pf.preflight(m, passed=checked.model_copy(update={"key": "another key"}))


def test_the_record_names_the_tokenizer_class_and_rows_build_by_it_without_torch(demo) -> None:
    checked = pf.preflight(load_manifest(demo))
    assert checked.tokenizer_class == "transformers.tokenization_utils_tokenizers:TokenizersBackend"
    # what an actor does with it (regen.engine.actor.LazyRows), in a fresh interpreter
    code = (
        "import sys\n"
        "from regen.engine.inputs import row_settings\n"
        "from regen.engine.worker import default_row_builder\n"
        "from regen.manifest import load_manifest\n"
        "from regen.template.render import RenderSetup\n"
        "default_row_builder(row_settings(load_manifest(sys.argv[1]), RenderSetup(sys.argv[2])))\n"
        "print('torch' in sys.modules)\n"
    )
    got = subprocess.run([sys.executable, "-c", code, str(demo), checked.tokenizer_class],
                         capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    assert got.stdout.split() == ["False"]


def test_paths_are_always_checked(demo) -> None:
    m = load_manifest(demo)
    checked = pf.preflight(m)
    (demo.parent / "demo" / "xlam.jsonl").unlink()
    with pytest.raises(ConfigError, match=r"sources\.\d+\.path: source file not found"):
        pf.preflight(m, passed=checked)


def test_a_changed_template_is_checked_again(demo) -> None:
    m = load_manifest(demo)
    checked = pf.preflight(m)
    cfg = demo.parent / "demo" / "tokenizer" / "tokenizer_config.json"
    data = json.loads(cfg.read_text())
    data["chat_template"] = "{% for m in messages %}{{ m.content | no_such_filter }}{% endfor %}"
    cfg.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"target\.tokenizer"):
        pf.preflight(m, passed=checked)


def _append_blank_line(path: Path) -> None:
    with path.open("a") as f:
        f.write("\n")


@pytest.mark.parametrize(
    "change",
    [
        lambda d, m: _append_blank_line(d / "demo" / "sharegpt.jsonl"),
        lambda d, m: m.model_copy(
            update={"sampling": m.sampling.model_copy(update={"thinking": not m.sampling.thinking})}
        ),
        lambda d, m: m.model_copy(
            update={"target": m.target.model_copy(update={"template": "kimi-k2"})}
        ),
    ],
)
def test_what_the_checks_depend_on_changes_the_key(demo, change) -> None:
    m = load_manifest(demo)
    key = pf.checks_key(m)
    got = change(demo.parent, m)
    assert pf.checks_key(got if hasattr(got, "sources") else m) != key


def test_the_record_is_read_without_creating_the_run_directory(tmp_path) -> None:
    assert _passed_checks(RunDir.open(tmp_path / "nothing", create=False)) is None
    assert not (tmp_path / "nothing").exists()
