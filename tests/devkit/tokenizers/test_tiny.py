"""The tiny tokenizers: reproducible builds, each family's real tokens and template, loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.devkit.tokenizers.tiny import (
    BASE_VOCAB,
    SPECIAL_TOKENS,
    TEMPLATES_DIR,
    VOCAB_SIZE,
    build_tiny_tokenizer,
    tiny_family,
    tiny_info,
)

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "manifests" / "demo" / "tokenizer"


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    build_tiny_tokenizer(out)
    return out


def test_rebuild_reproduces_committed_files_byte_for_byte(rebuilt: Path) -> None:
    names = sorted(p.name for p in COMMITTED.iterdir())
    assert names == ["tokenizer.json", "tokenizer_config.json"]
    for name in names:
        assert (rebuilt / name).read_bytes() == (COMMITTED / name).read_bytes(), name


def test_info_exposes_vocab_and_special_ids() -> None:
    info = tiny_info(COMMITTED)
    assert info.vocab_size == VOCAB_SIZE == 1024
    # special tokens sit on top of the learned vocab, in Kimi id order
    assert [info.special_ids[t] for t in SPECIAL_TOKENS] == list(range(BASE_VOCAB, VOCAB_SIZE))
    assert info.eos_id == info.special_ids["<|im_end|>"]
    assert info.pad_id == VOCAB_SIZE - 1
    assert info.bos_id == BASE_VOCAB


def test_loads_with_auto_tokenizer_without_remote_code() -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(COMMITTED))
    assert len(tok) == VOCAB_SIZE
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token == "[PAD]"
    assert tok.bos_token == "[BOS]"
    assert tok.chat_template and "tool_declare" in tok.chat_template
    # special-token text inside ordinary strings encodes as the special token (Kimi default)
    ids = tok.encode("a<think>b</think>c<|im_end|>", add_special_tokens=False)
    assert tok.convert_tokens_to_ids("<think>") in ids
    assert ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    # nothing is added around plain text, and arbitrary Unicode round-trips (byte-level BPE)
    text = "Grüße, 世界! naïve → ∑ 🙂"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < VOCAB_SIZE for i in ids)


@pytest.mark.parametrize(
    "family",
    ["qwen3", "deepseek_v3", "qwen3_coder", "glm45", "glm47", "deepseek_v4", "response_template"],
)
def test_other_families_rebuild_byte_for_byte(family: str, tmp_path: Path) -> None:
    committed = REPO / tiny_family(family).committed
    build_tiny_tokenizer(tmp_path, family)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (committed / name).read_bytes(), name


@pytest.mark.parametrize(
    ("family", "eos", "bos", "calls_begin", "template_file"),
    [
        ("qwen3", "<|im_end|>", None, "<tool_call>", "qwen3.jinja"),
        ("deepseek_v3", "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>",
         "<｜tool▁calls▁begin｜>", "deepseek_v3.jinja"),
        ("qwen3_coder", "<|im_end|>", None, "<tool_call>", "qwen3_coder.jinja"),
        ("glm45", "<|endoftext|>", None, "<tool_call>", "glm45.jinja"),
        ("glm47", "<|endoftext|>", None, "<tool_call>", "glm47.jinja"),
        ("deepseek_v4", "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>", "｜DSML｜", None),
    ],
)  # fmt: skip
def test_other_families_hold_their_real_tokens_and_template(
    family: str, eos: str, bos: str | None, calls_begin: str, template_file: str | None
) -> None:
    from transformers import AutoTokenizer

    fam = tiny_family(family)
    committed = REPO / fam.committed
    tok = AutoTokenizer.from_pretrained(str(committed))
    assert len(tok) == VOCAB_SIZE
    assert tok.eos_token == eos and tok.bos_token == bos
    # the family's tokens sit on top of the learned vocab, in the real tokenizer's id order
    info = tiny_info(committed)
    assert [info.special_ids[t] for t, _ in fam.tokens] == list(range(fam.base_vocab, VOCAB_SIZE))
    # the chat template is the vendored real one, byte for byte (none: encoded in Python)
    if template_file is None:
        assert not tok.chat_template
    else:
        assert tok.chat_template == (TEMPLATES_DIR / template_file).read_text(encoding="utf-8")
    for marker in ("<think>", "</think>", calls_begin):
        ids = tok.encode(f"a{marker}b", add_special_tokens=False)
        assert tok.convert_tokens_to_ids(marker) in ids
        # the think and tool tokens are not special (as in the real tokenizers): decoding
        # without special tokens keeps them, so a server's parsers see them
        assert marker in tok.decode(ids, skip_special_tokens=True)
    text = "Grüße, 世界! naïve → ∑ 🙂"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    # the family of regen.targets recognises the tokenizer, when it is there
    from regen.targets import FAMILIES, recognise_dir

    assert recognise_dir(committed) is FAMILIES[family]
