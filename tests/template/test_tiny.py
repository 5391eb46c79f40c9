"""The tiny Kimi-format tokenizer: reproducible build, Kimi special tokens, transformers loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.template.tiny import (
    BASE_VOCAB,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    build_tiny_tokenizer,
    tiny_info,
)

REPO = Path(__file__).resolve().parents[2]
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
