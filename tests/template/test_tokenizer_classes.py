"""The class AutoTokenizer picked for a directory, remembered for the next process
(regen.template.tokenizer_classes).

A fresh interpreter resolves the tiny Kimi tokenizer (AutoTokenizer, torch imported); the next
one loads it by the remembered class, without torch, to the same class and ids. A directory
changed since, or loaded with the other remote-code setting, is resolved again; a remembered
class that does not load is resolved again and replaced; a cache that cannot be written, or one
set empty, is no error.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from regen.devkit.tokenizers.tiny import TINY_FAMILIES
from regen.template import tokenizer_classes
from regen.template.tokenizer import class_spec, load_tokenizer
from regen.template.tokenizer_classes import cache_root, class_entry, remember
from regen.template.tokenizer_classes import remembered as kept

REPO = Path(__file__).resolve().parents[2]
KIMI = REPO / TINY_FAMILIES["kimi"].committed
TEXT = "What is 2 + 2? <|im_end|>"

#: loads a directory with no spec in a fresh interpreter; prints what to compare, and whether
#: torch was imported
LOAD = """
import json, sys
from regen.template.tokenizer import load_tokenizer
tok = load_tokenizer(sys.argv[1])
print(json.dumps({"class": type(tok).__qualname__, "torch": "torch" in sys.modules,
                  "ids": tok.encode(sys.argv[2], add_special_tokens=False)}))
"""


@pytest.fixture
def tok_dir(tmp_path: Path) -> Path:
    return Path(shutil.copytree(KIMI, tmp_path / "tok"))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("REGEN_CACHE_DIR", str(root))
    return root


def load_in_a_fresh_process(path: Path, cache: Path) -> dict:
    env = {**os.environ, "REGEN_CACHE_DIR": str(cache)}
    got = subprocess.run([sys.executable, "-c", LOAD, str(path), TEXT], capture_output=True,
                         text=True, cwd=REPO, env=env, check=True, timeout=120)  # fmt: skip
    return json.loads(got.stdout.strip().splitlines()[-1])


def remembered(path: Path, trust_remote_code: bool) -> str | None:
    return kept(class_entry(path, trust_remote_code))


def entries(cache: Path) -> dict[str, str]:
    folder = cache / tokenizer_classes.CLASSES
    return {p.name: p.read_text() for p in folder.iterdir()} if folder.is_dir() else {}


def test_the_next_process_loads_the_class_the_first_resolved_without_torch(
    tok_dir: Path, cache: Path
) -> None:
    first = load_in_a_fresh_process(tok_dir, cache)
    assert first["torch"]  # AutoTokenizer's resolution
    spec = class_spec(load_tokenizer(tok_dir))
    assert spec is not None and list(entries(cache).values()) == [spec + "\n"]
    second = load_in_a_fresh_process(tok_dir, cache)
    assert not second["torch"]
    assert (second["class"], second["ids"]) == (first["class"], first["ids"])
    assert len(first["ids"]) > 3


def test_a_directory_changed_since_or_the_other_remote_code_setting_is_resolved_again(
    tok_dir: Path, cache: Path
) -> None:
    spec = class_spec(load_tokenizer(tok_dir))
    assert spec is not None and remembered(tok_dir, False) == spec
    assert remembered(tok_dir, True) is None
    config = tok_dir / "tokenizer_config.json"
    st = config.stat()
    os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert remembered(tok_dir, False) is None
    load_tokenizer(tok_dir)
    assert remembered(tok_dir, False) == spec
    (tok_dir / "added.txt").write_text("a file more")
    assert remembered(tok_dir, False) is None
    assert len(entries(cache)) == 2  # one per state of the directory


def test_a_remembered_class_that_does_not_load_is_resolved_again_and_replaced(
    tok_dir: Path, cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    remember(class_entry(tok_dir, False), "transformers:NoSuchTokenizer")
    with caplog.at_level(logging.INFO, logger="regen.template.tokenizer"):
        tok = load_tokenizer(tok_dir)
    assert "transformers:NoSuchTokenizer did not load" in caplog.text
    assert remembered(tok_dir, False) == class_spec(tok) != "transformers:NoSuchTokenizer"
    assert len(entries(cache)) == 1


def test_a_cache_that_cannot_be_written_or_is_set_empty_is_no_error(
    tok_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("REGEN_CACHE_DIR", str(blocked))
    assert class_spec(load_tokenizer(tok_dir)) is not None
    assert remembered(tok_dir, False) is None and blocked.read_text() == "not a folder"
    monkeypatch.setenv("REGEN_CACHE_DIR", "")
    assert cache_root() is None
    assert class_spec(load_tokenizer(tok_dir)) is not None
    assert remembered(tok_dir, False) is None


def test_the_cache_is_below_xdg_cache_home_else_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REGEN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "regen"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "regen"
