"""Batched encode/decode (regen.template.codec) and prompt ids reused across turns
(regen.template.extend): the same ids and text as one whole transformers call per text, on the
golden conversations, on the benchmark workload and on chains the Kimi template rewrites."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from benchmarks._workload import make_rows
from regen.core.sample import Message, ToolCall
from regen.targets.kimi import KIMI
from regen.template.codec import PROBES, TokenCodec
from regen.template.extend import Boundaries
from regen.template.render import Renderer

BOUNDARY_TOKENS = KIMI.boundary_tokens()

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"

TEXTS = [
    *PROBES,
    "word " * 300,
    "<|im_end|><|im_end|>",
    "x<think>  \n</think>y",
    "<|im_system|>tool<|im_middle|>## Return of functions.f:0\n{}<|im_end|>",
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(TOKENIZER))


def whole(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def test_the_rust_backend_gives_the_transformers_ids_and_text(tokenizer) -> None:
    codec = TokenCodec(tokenizer)
    assert codec.batched
    ids = codec.encode_many(TEXTS)
    assert ids == [whole(tokenizer, t) for t in TEXTS]
    assert codec.decode_many(ids) == [
        tokenizer.decode(i, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        for i in ids
    ]
    assert codec.encode_many([]) == [] and codec.decode_many([]) == []


def test_a_backend_in_another_state_is_not_called_directly() -> None:
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    codec = TokenCodec(tok)
    tok.backend_tokenizer.enable_truncation(max_length=4)  # e.g. left by another caller
    long_text = "word " * 50
    assert not codec._ready()
    assert codec.encode_many([long_text]) == [whole(tok, long_text)]
    assert len(codec.encode_many([long_text])[0]) > 4


def test_a_tokenizer_without_a_backend_is_encoded_one_by_one(tokenizer) -> None:
    class Slow:  # the shape of a slow (e.g. tiktoken-based) tokenizer: no backend_tokenizer
        def encode(self, text: str, add_special_tokens: bool) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=add_special_tokens)

        def decode(self, ids: list[int], **kw: Any) -> str:
            return tokenizer.decode(ids, **kw)

    codec = TokenCodec(Slow())
    assert not codec.batched
    assert codec.encode_many(TEXTS) == [whole(tokenizer, t) for t in TEXTS]


def test_boundaries_of_the_kimi_format(tokenizer) -> None:
    b = Boundaries(TokenCodec(tokenizer), BOUNDARY_TOKENS)
    assert set(b.tokens) == set(BOUNDARY_TOKENS)
    text = "a<|im_end|>b<think>c"
    assert b.last_cut(text, len(text)) == (len("a<|im_end|>b<think>"), 2)
    assert b.last_cut(text, len("a<|im_end|>b<thi")) == (len("a<|im_end|>"), 1)
    assert b.last_cut("plain", 5) == (0, 0)
    ids = whole(tokenizer, text)
    assert ids[: b.ids_through(ids, 1)] == whole(tokenizer, "a<|im_end|>")
    assert b.ids_through(ids, 3) == -1


def test_a_token_that_merges_with_its_neighbours_is_no_boundary(tokenizer) -> None:
    b = Boundaries(TokenCodec(tokenizer), ["<|im_end|>", "word", "nonexistent-token"])
    assert set(b.tokens) == {"<|im_end|>"}


def chain_prompts(r: Renderer, messages: list[dict[str, Any]], tools: Any = None):
    """The rendered prompt of every assistant turn of ``messages`` (history as given)."""
    texts = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            texts.append(r.render_text(messages[:i], tools, reasoning="R.", content="A."))
    return texts


def tokenized_like_whole(r: Renderer, texts) -> list[Any]:
    before = [None, *range(len(texts) - 1)]
    turns = r.tokenize(texts, before)
    for t in turns:
        assert t.prompt_ids == whole(r.tokenizer, t.prompt_text)
        assert t.response_ids == whole(r.tokenizer, t.response_text)
    return turns


def conversation(rng: random.Random, turns: int, tools: bool) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    for t in range(turns):
        msgs.append({"role": "user", "content": f"question {t} " + "word " * rng.randint(1, 40)})
        if tools and rng.random() < 0.6:
            call = ToolCall(id=f"functions.f:{t}", name="f", arguments='{"a": 1}')
            msgs.append(Message("assistant", "", reasoning=f"why {t}",
                                tool_calls=(call,)).to_openai())  # fmt: skip
            msgs.append({"role": "tool", "tool_call_id": call.id, "content": f"result {t}"})
        msgs.append({"role": "assistant", "content": f"answer {t}", "reasoning_content": "r"})
    return msgs


def test_reused_prompt_ids_equal_whole_encodes_and_the_kinds_are_counted() -> None:
    r = Renderer.from_dir(TOKENIZER, template_kwargs={"thinking": True})
    rng = random.Random(7)
    for k in range(40):
        tools = k % 2 == 1
        msgs = conversation(rng, rng.randint(2, 5), tools)
        tokenized_like_whole(r, chain_prompts(r, msgs, [{"type": "function"}] if tools else None))
    st = r.prompts.stats
    assert st["extended"] > 20  # the plain answers: each prompt starts with the one before
    # a plain answer after tool calls drops their reasoning: the history is rewritten
    assert st["common_prefix"] > 5
    assert st["first"] == 40 and st["mismatch"] == 0
    assert r.prompts.enabled


def test_the_benchmark_workload_reuses_every_later_prompt() -> None:
    r = Renderer.from_dir(TOKENIZER, template_kwargs={"thinking": True})
    for row in make_rows(60, multi=0.5):
        msgs = [
            {"role": "user" if c["from"] == "human" else "assistant", "content": c["value"]}
            for c in row["conversations"]
        ]
        tokenized_like_whole(r, chain_prompts(r, msgs))
    st = r.prompts.stats
    assert st["extended"] > 16 and st["common_prefix"] == st["full"] == st["mismatch"] == 0


def test_a_wrong_boundary_is_caught_and_reuse_stops(caplog) -> None:
    """A 'boundary' the tokenizer merges across: the first reuse is checked, differs, and
    every prompt is encoded whole from then on (rows stay right)."""
    r = Renderer.from_dir(TOKENIZER, template_kwargs={"thinking": True})
    b = r.prompts.boundaries
    b.tokens = {**b.tokens, "wor": r.tokenizer.convert_tokens_to_ids("<|im_end|>")}
    msgs = [{"role": "user", "content": "say wor"}, {"role": "assistant", "content": "x"}]
    first = r.render_text(msgs[:1], None, reasoning="R.", content="A.")
    first.prompt_text = first.prompt_text + "wor"  # ends with the fake boundary
    second = r.render_text(msgs[:1], None, reasoning="R.", content="A.")
    second.prompt_text = first.prompt_text + "d and more"
    turns = tokenized_like_whole(r, [first, second])
    assert len(turns) == 2
    assert r.prompts.stats["mismatch"] == 1 and not r.prompts.enabled
    assert "encoding every prompt whole" in caplog.text


def test_golden_multi_turn_chain_is_byte_equal() -> None:
    from test_golden import CASES

    r = Renderer.from_dir(TOKENIZER, template_kwargs={"thinking": True})
    for name in ("multi_turn_reasoning", "tool_calls"):
        messages, tools, _ = CASES[name]
        msgs = [*messages, {"role": "assistant", "content": "end"}]
        tokenized_like_whole(r, chain_prompts(r, msgs, tools))
