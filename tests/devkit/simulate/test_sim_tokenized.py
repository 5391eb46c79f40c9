"""Server token ids rendered with the tiny Kimi tokenizer's own chat template, from the request
as SGLang hands it to the template (its own code: tests/contract/_served.py)."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _sim_common import MODEL

from regen.devkit.simulate import AnswerConfig, answer
from regen.devkit.simulate.testing import RunningSimulator, simulator_in_thread

TOKENIZER = Path(__file__).resolve().parents[3] / "manifests" / "demo" / "tokenizer"
CONTRACT = Path(__file__).resolve().parents[2] / "contract"
pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not TOKENIZER.is_dir(), reason="manifests/demo/tokenizer not built yet"),
]
CFG = AnswerConfig(mean_tokens=30, tool_call_rate=1.0)
TOOLS = [{"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningSimulator]:
    with simulator_in_thread(
        instant=True, tokenizer=TOKENIZER, mean_tokens=30, tool_call_rate=1.0
    ) as s:  # fmt: skip
        yield s


def sglang_inputs(body: dict[str, Any], template: str) -> tuple[list[Any], list[Any] | None]:
    """The messages and tools SGLang hands the template (its own code, tests/contract)."""
    sys.path.insert(0, str(CONTRACT))
    from _served import sglang_inputs as inputs

    return inputs(body, template)


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER))


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=20) as r:
        return json.loads(r.read())


@pytest.mark.parametrize(
    ("thinking", "tools"),
    [(True, None), (False, None), (True, TOOLS)],
    ids=["think", "off", "tools"],
)
def test_prompt_and_output_ids(sim, tok, thinking, tools):
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"ids {thinking} {bool(tools)}"}],
        "max_tokens": 200,
        "chat_template_kwargs": {"thinking": thinking},
        "return_prompt_token_ids": True,
        "return_token_ids": True,
    }
    if tools:
        body["tools"] = tools
    res = post(sim.url, body)
    ans = answer(body, CFG)
    messages, served_tools = sglang_inputs(body, tok.chat_template)
    prompt = tok.apply_chat_template(
        messages, tools=served_tools, add_generation_prompt=True, tokenize=False, thinking=thinking
    )
    choice = res["choices"][0]  # SGLang puts both lists on the choice
    assert "prompt_token_ids" not in res
    assert choice["prompt_token_ids"] == tok.encode(prompt, add_special_tokens=False)
    out = choice["response_token_ids"]
    assert res["usage"]["prompt_tokens"] == len(choice["prompt_token_ids"])
    assert res["usage"]["completion_tokens"] == len(out)
    text = tok.decode(out, skip_special_tokens=False)
    calls = "".join(
        f"<|tool_call_begin|>{c.id}<|tool_call_argument_begin|>{c.arguments}<|tool_call_end|>"
        for c in ans.tool_calls
    )
    section = f"<|tool_calls_section_begin|>{calls}<|tool_calls_section_end|>" if calls else ""
    head = f"{ans.reasoning}</think>" if thinking else ""
    assert text == f"{head}{ans.content}{section}<|im_end|>"
    assert res["choices"][0]["message"]["content"] == ans.content  # "" when empty, never null
    assert ("tool_calls" in res["choices"][0]["message"]) == bool(calls)


def test_prompt_ids_only_when_asked(sim):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "only the prompt"}]}
    res = post(sim.url, {**body, "return_prompt_token_ids": True})
    choice = res["choices"][0]
    assert choice["prompt_token_ids"] and "response_token_ids" not in choice
    plain = post(sim.url, body)
    assert "prompt_token_ids" not in plain["choices"][0]
    assert plain["usage"]["prompt_tokens"] == len(choice["prompt_token_ids"])


def test_streamed_ids_arrive_in_the_sglext_chunk_before_usage(sim, tok):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "stream my ids"}],
        "max_tokens": 200,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_input_ids_in_sglext": True,
        "return_output_ids_in_sglext": True,
    }
    req = urllib.request.Request(sim.url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=20) as r:
        lines = [ln[6:] for ln in r.read().decode().splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    events = [json.loads(x) for x in lines[:-1]]
    ext_at = next(i for i, e in enumerate(events) if "sglext" in e)
    finish_at = next(i for i, e in enumerate(events) if e["choices"] and
                     e["choices"][0]["finish_reason"])  # fmt: skip
    usage_at = next(i for i, e in enumerate(events) if e.get("usage"))
    assert finish_at < ext_at < usage_at and events[ext_at]["choices"] == []
    ext = events[ext_at]["sglext"]
    messages, _ = sglang_inputs(body, tok.chat_template)
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert ext["input_ids"] == tok.encode(prompt, add_special_tokens=False)
    (out,) = ext["output_ids"]  # one list per choice
    assert len(out) == events[usage_at]["usage"]["completion_tokens"]
    assert tok.decode(out, skip_special_tokens=False).endswith("<|im_end|>")
