"""The SSE fast path (regen.client.stream) gives exactly what the full JSON parse gives.

Every body goes through two accumulators, fast path on and off (``_sse.assert_same``): streams
serialized by SGLang 0.5.23's own ``build_sse_content`` and protocol models with text that
JSON escapes (quotes, backslashes, control characters, non-ASCII, text that looks like the
chunk's own keys), lines damaged or re-shaped after a shape was learned, and whole bodies of
the simulated SGLang server (``regen simulate``) in its streaming variants. The contract
streams of test_response_contract.py are checked the same way in its ``run``.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from _sse import assert_same
from test_response_contract import Stream

from regen.devkit.simulate.testing import simulator_in_thread

TOKENIZER = Path(__file__).resolve().parents[2] / "manifests" / "demo" / "tokenizer"

TEXTS = [
    "Hello",
    " world",
    "\n\n",
    "tab\there",
    'a "quoted" word',
    "back\\slash \\n not a newline",
    "/slash</think>",
    "café é",
    "日本語のテキスト",
    "🙂 emoji",
    "\u2028\u2029",
    "\x00\x01\x1f\x7f",
    '"},"logprobs":null,"finish_reason":"stop","matched_stop":null}]}',
    '"content":"',
    '","content":"x',
    "zq",
    "\\u0041",
    " ",
]


def sglang_stream(p: Any, sse: Any, texts: list[str]) -> Stream:
    """Role chunk, reasoning then content one text per chunk, a tool call, finish, sglext,
    usage: the order SGLang's serving_chat writes them."""
    s = Stream(p, sse).content(role="assistant", content="")
    for t in texts:
        s.content(reasoning_content=t)
    for t in texts:
        s.content(content=t)
    s.tool_delta(0, id="functions.f:0", name="f", arguments="")
    s.tool_delta(0, arguments='{"q": "\\"x\\""}')
    s.content(finish_reason="tool_calls", matched_stop=None)
    s.model(choices=[], sglext=p.SglExt(input_ids=[1, 2], output_ids=[[3, 4]]))
    return s.usage(prompt_tokens=2, completion_tokens=2, total_tokens=4)


def test_sglang_serialized_streams(protocol, sse_utils) -> None:
    for texts in (TEXTS, TEXTS[::-1], ["a"] * 50, [t for t in TEXTS if t] * 3):
        body = sglang_stream(protocol, sse_utils, texts).reply().body
        taken = assert_same(body)
        # every text chunk after the first of each kind (reasoning, content) is taken fast
        assert taken == 2 * (len([t for t in texts if t]) - 1)


def test_a_stream_of_only_one_kind(protocol, sse_utils) -> None:
    s = Stream(protocol, sse_utils).content(role="assistant", content="")
    for t in TEXTS:
        s.content(content=t)
    assert assert_same(s.content(finish_reason="stop").reply().body) == len(TEXTS) - 1


def _learned(protocol, sse_utils) -> tuple[bytes, list[bytes]]:
    """Two content lines (the shape is learned) and the bytes around the string."""
    s = Stream(protocol, sse_utils).content(content="first").content(content="second")
    lines = [x for x in s.reply().body.split(b"\n") if x.startswith(b"data: {")]
    head, _, tail = lines[1].partition(b"second")
    return head + b"\x00" + tail, lines


@pytest.mark.parametrize(
    "middle",
    [
        b"raw\x01control",  # json refuses raw control characters
        b"bad \xff utf-8",
        b"\xed\xa0\x80 encoded surrogate",  # json.loads' surrogatepass accepts it
        b"bad \\q escape",
        b'x","content":"y',  # a duplicate key: the last one wins
        b'x","reasoning_content":"r',
        b'x"},"logprobs":null,"finish_reason":"stop","extra":{"a":"',
        b"\\ud83d\\ude00 pair",
        b"\\ud800 lone",
        b"",
        b"trailing backslash \\\\",
        b'\\"',
    ],
)
def test_lines_after_a_shape_is_learned(protocol, sse_utils, middle: bytes) -> None:
    template, lines = _learned(protocol, sse_utils)
    odd = template.replace(b"\x00", middle)
    body = b"\n".join([*lines, odd, lines[1], b"data: [DONE]"])
    assert_same(body)


def test_a_shape_is_not_learned_from_a_chunk_that_does_more(protocol, sse_utils) -> None:
    """Text next to usage or a tool call in the same chunk: every such chunk is parsed in full."""
    p = protocol
    s = Stream(p, sse_utils)
    for t in ("a", "b", "c"):
        s.model(choices=[], usage=p.UsageInfo(prompt_tokens=1, completion_tokens=1,
                                               total_tokens=2))  # fmt: skip
        s.parts[-1] = s.parts[-1].replace('"choices":[]', '"choices":[{"index":0,"delta":'
                                          f'{{"content":"{t}"}}}}]')  # fmt: skip
    assert assert_same(s.reply().body) == 0
    s = Stream(p, sse_utils)
    for t in ("a", "b", "c"):
        call = p.ToolCall(index=0, function=p.FunctionResponse(arguments=t))
        choice = p.ChatCompletionResponseStreamChoice(
            index=0, delta=p.DeltaMessage(content=t, tool_calls=[call]), finish_reason=None
        )
        s.model(choices=[choice])
    assert assert_same(s.reply().body) == 0


def _post(url: str, body: dict[str, Any]) -> bytes:
    req = urllib.request.Request(f"{url}/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "options",
    [
        {"tokenizer": str(TOKENIZER), "tool_call_rate": 0.5},
        {"tokens_per_step": 3, "usage_shape": "finish", "tool_call_rate": 0.3},
    ],
)
def test_simulator_streams(options: dict[str, Any]) -> None:
    taken = 0
    with simulator_in_thread(instant=True, model_name="m", **options) as sim:
        for i in range(12):
            body: dict[str, Any] = {
                "model": "m",
                "messages": [{"role": "user", "content": f"Question {i}: explain item {i}."}],
                "max_completion_tokens": 200,
                "stream": True,
                "stream_options": {"include_usage": True},
                "return_input_ids_in_sglext": True,
                "return_output_ids_in_sglext": True,
                "separate_reasoning": i % 3 != 0,
                "chat_template_kwargs": {"thinking": i % 4 != 1},
            }
            if i % 2:
                body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
            taken += assert_same(_post(sim.url, body))
    assert taken > 12 * 20
