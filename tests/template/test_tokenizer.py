"""A tokenizer loaded by the class AutoTokenizer resolved is the same tokenizer, without torch.

For the committed tiny tokenizers of every family, a directory that declares a class of
transformers and one whose class is its own code (``auto_map``, remote code): the spec
:func:`class_spec` takes from AutoTokenizer's tokenizer loads, in a fresh interpreter, a
tokenizer of the same class that renders and encodes a conversation to the same text and ids,
and that interpreter never imports torch. A spec that does not load falls back to AutoTokenizer.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from regen.core.errors import TemplateError
from regen.devkit.tokenizers.tiny import TINY_FAMILIES
from regen.targets import recognise_dir
from regen.template.render import Renderer
from regen.template.tokenizer import class_spec, load_tokenizer

REPO = Path(__file__).resolve().parents[2]
KIMI = REPO / TINY_FAMILIES["kimi"].committed

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3 + 3?"},
]

#: loads a directory by spec in a fresh interpreter; prints what to compare, and whether torch
#: was imported
BY_SPEC = """
import json, sys
from regen.template.tokenizer import load_tokenizer
from regen.template.render import Renderer
from regen.targets import recognise_dir
tok = load_tokenizer(sys.argv[1], sys.argv[3] == "1", sys.argv[2])
msgs = json.loads(sys.argv[4])
text = Renderer(tok, family=recognise_dir(sys.argv[1])).render_prompt(msgs)
print(json.dumps({"class": type(tok).__qualname__, "text": text,
                  "ids": tok.encode(text, add_special_tokens=False),
                  "special": sorted(tok.all_special_tokens), "torch": "torch" in sys.modules}))
"""


def remote_code_dir(tmp_path: Path) -> Path:
    """The tiny Kimi tokenizer with its class in its own code (``auto_map``)."""
    out = tmp_path / "remote"
    shutil.copytree(KIMI, out)
    (out / "tokenization_tiny_remote.py").write_text(
        "from transformers import PreTrainedTokenizerFast\n\n\n"
        "class TinyRemoteTokenizer(PreTrainedTokenizerFast):\n"
        "    marker = 'remote'\n"
    )
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "TinyRemoteTokenizer"
    cfg["auto_map"] = {"AutoTokenizer": [None, "tokenization_tiny_remote.TinyRemoteTokenizer"]}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return out


def by_spec(path: Path, spec: str, remote: bool) -> dict:
    got = subprocess.run(
        [sys.executable, "-c", BY_SPEC, str(path), spec, "1" if remote else "0",
         json.dumps(MESSAGES)],
        capture_output=True, text=True, cwd=REPO, check=True, timeout=120,
    )  # fmt: skip
    return json.loads(got.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_by_spec_is_autotokenizers_tokenizer_without_torch(family: str) -> None:
    path = REPO / TINY_FAMILIES[family].committed
    auto = load_tokenizer(path)
    spec = class_spec(auto)
    assert spec == "transformers.tokenization_utils_tokenizers:TokenizersBackend"
    # the template's render (the family's encoder's, for a family without one: DeepSeek-V4)
    text = Renderer(auto, family=recognise_dir(path)).render_prompt(MESSAGES)
    got = by_spec(path, spec, remote=False)
    assert got == {"class": type(auto).__qualname__, "text": text,
                   "ids": auto.encode(text, add_special_tokens=False),
                   "special": sorted(auto.all_special_tokens), "torch": False}  # fmt: skip


def test_a_class_of_the_directorys_own_code_is_named_and_loaded_by_spec(tmp_path) -> None:
    path = remote_code_dir(tmp_path)
    auto = load_tokenizer(path, trust_remote_code=True)
    assert type(auto).__name__ == "TinyRemoteTokenizer" and auto.marker == "remote"
    spec = class_spec(auto)
    assert spec == "remote:tokenization_tiny_remote.TinyRemoteTokenizer"
    got = by_spec(path, spec, remote=True)
    text = Renderer(auto, family=recognise_dir(path)).render_prompt(MESSAGES)
    assert (got["class"], got["text"], got["torch"]) == ("TinyRemoteTokenizer", text, False)
    assert got["ids"] == auto.encode(text, add_special_tokens=False)


def test_remote_code_stays_refused_by_spec(tmp_path) -> None:
    path = remote_code_dir(tmp_path)
    spec = "remote:tokenization_tiny_remote.TinyRemoteTokenizer"
    # the spec does not run the directory's code; AutoTokenizer then refuses it as before
    with pytest.raises(TemplateError, match="trust_remote_code"):
        load_tokenizer(path, trust_remote_code=False, spec=spec)


@pytest.mark.parametrize(
    "spec",
    ["transformers.no_such_module:Tokenizer", "transformers:NoSuchTokenizer", "os:system",
     "transformers.tokenization_utils_tokenizers"],
)  # fmt: skip
def test_a_spec_that_does_not_load_falls_back_to_autotokenizer(spec: str, caplog) -> None:
    caplog.set_level(logging.INFO, logger="regen.template.tokenizer")
    tok = load_tokenizer(KIMI, spec=spec)
    assert class_spec(tok) == "transformers.tokenization_utils_tokenizers:TokenizersBackend"
    assert "resolving it again" in caplog.text


def test_a_class_from_elsewhere_has_no_spec() -> None:
    class Outside:
        pass

    assert class_spec(Outside()) is None
