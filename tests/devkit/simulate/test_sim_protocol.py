"""The SGLang protocol of CONTRACTS §2, spoken to the real `openai` client (httpx2 inside)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest
from _sim_common import ANSWER, MODEL

from regen.devkit.simulate import answer, conversation_key, count_tokens, request_key

pytestmark = pytest.mark.timeout(60)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {
                "type": "object",
                "properties": {"word": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["word"],
            },
        },
    }
]


def body(tag: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": f"Explain {tag}."},
        ],
        "max_tokens": 512,
        **extra,
    }


def expected(b: dict[str, Any]):
    return answer(b, ANSWER)


def create(url: str, b: dict[str, Any], **kw: Any) -> Any:
    """One chat.completions.create call; streams are collected into a list of chunks."""
    standard = {"model", "messages", "max_tokens", "tools", "seed", "stream", "stream_options"}
    args = {k: v for k, v in b.items() if k in standard}
    extra = {k: v for k, v in b.items() if k not in standard}

    async def go() -> Any:
        client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=20)
        try:
            res = await client.chat.completions.create(**args, extra_body=extra or None, **kw)
            if b.get("stream"):
                return [chunk async for chunk in res]
            return res
        finally:
            await client.close()

    return asyncio.run(go())


def raw_post(url: str, payload: bytes) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url + "/chat/completions", data=payload, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def first_with_tools(**extra: Any) -> dict[str, Any]:
    """The first request (by tag) whose deterministic answer calls a tool."""
    for i in range(100):
        b = body(f"tools {i}", tools=TOOLS, **extra)
        if expected(b).tool_calls:
            return b
    raise AssertionError("no tool-calling answer in 100 tries")


# ---- info endpoints --------------------------------------------------------------------------


def test_health_models_and_infos(sim):
    assert sim.get("/health") is None
    assert sim.get("/health_generate") is None
    (card,) = sim.get("/v1/models")["data"]
    assert card["id"] == MODEL and card["root"] == MODEL and card["max_model_len"] == 4096
    assert sim.get("/model_info") == sim.get("/get_model_info")
    assert sim.get("/model_info")["model_path"] == MODEL
    info = sim.get("/server_info")
    assert info == {**sim.get("/get_server_info"), "internal_states": info["internal_states"]}
    # SGLang: the top-level value is the --max-running-requests flag (None unless given); the
    # live batch size is in internal_states, per DP rank
    assert info["max_running_requests"] is None and info["version"]
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 64
    assert info["port"] == sim.port and info["context_length"] == 4096
    assert info["speculative_algorithm"] == "EAGLE3"
    assert info["speculative_draft_model_path"] == "/models/draft"
    assert (
        info["speculative_num_steps"],
        info["speculative_eagle_topk"],
        info["speculative_num_draft_tokens"],
    ) == (3, 1, 4)
    # SGLang's running total: reported once a verify step ran (the shared server has served
    # requests by now: /health_generate above at least prefilled one)
    create(sim.url, body("acceptance", max_tokens=32))
    accept = sim.get("/server_info")["internal_states"][0]["avg_spec_accept_length"]
    assert 1.0 <= accept <= 2.1


def test_no_speculative_state_without_the_flag(sim_finish):
    info = sim_finish.get("/server_info")
    assert info["speculative_algorithm"] is None
    assert "avg_spec_accept_length" not in info["internal_states"][0]


# ---- streaming -------------------------------------------------------------------------------


def test_stream_sglang_shape(sim):
    b = body("streaming", stream=True, stream_options={"include_usage": True}, seed=1)
    ans = expected(b)
    chunks = create(sim.url, b)
    assert chunks[0].choices[0].delta.role == "assistant"
    kinds, reasoning, content = [], "", ""
    for ch in chunks[1:-2]:
        (choice,) = ch.choices
        assert choice.finish_reason is None and ch.usage is None
        d = choice.delta
        r, c = getattr(d, "reasoning_content", None), d.content
        assert (r is None) != (c is None)
        text = r if r is not None else c
        assert 1 <= count_tokens(text) <= 4  # one chunk per step: num_steps + 1 at most
        kinds.append("r" if r is not None else "c")
        reasoning += r or ""
        content += c or ""
    assert kinds == sorted(kinds, reverse=True)  # all reasoning, then all content
    assert (reasoning, content) == (ans.reasoning, ans.content)
    finish, last = chunks[-2], chunks[-1]
    assert finish.choices[0].finish_reason == ans.finish_reason == "stop"
    assert finish.usage is None
    assert last.choices == []
    u = last.usage
    assert (u.prompt_tokens, u.completion_tokens) == (ans.prompt_tokens, ans.completion_tokens)
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.reasoning_tokens == ans.reasoning_tokens == count_tokens(reasoning)


def test_stream_without_include_usage_has_no_usage(sim):
    chunks = create(sim.url, body("no usage", stream=True))
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stream_finish_shape(sim_finish):
    b = body("finish shape", stream=True, stream_options={"include_usage": True})
    ans = expected(b)
    chunks = create(sim_finish.url, b)
    assert all(c.choices for c in chunks)  # no choices-[] chunk
    finish = chunks[-1]
    assert finish.choices[0].finish_reason == "stop"
    assert finish.usage.completion_tokens == ans.completion_tokens
    assert finish.usage.reasoning_tokens == ans.reasoning_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_tool_calls(sim):
    b = first_with_tools(stream=True, stream_options={"include_usage": True})
    ans = expected(b)
    chunks = create(sim.url, b)
    calls: dict[int, dict[str, str]] = {}
    for ch in chunks:
        for choice in ch.choices:
            for tc in choice.delta.tool_calls or ():
                slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += tc.id or ""
                slot["name"] += (tc.function.name or "") if tc.function else ""
                slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
    got = [(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())]
    assert got == [(c.id, c.name, c.arguments) for c in ans.tool_calls]
    assert got[0][0] == "functions.lookup:0"
    assert "word" in json.loads(got[0][2])
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].usage.completion_tokens == ans.completion_tokens


def test_stream_truncated_by_max_tokens(sim):
    b = body("truncate", stream=True, max_tokens=5)
    chunks = create(sim.url, b)
    text = "".join((getattr(c.choices[0].delta, "reasoning_content", None) or "") for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert text == expected(b).reasoning and count_tokens(text) == 5


# ---- non-streaming ---------------------------------------------------------------------------


def test_non_streaming_message_and_usage(sim):
    b = body("plain", seed=3)
    ans = expected(b)
    res = create(sim.url, b)
    msg = res.choices[0].message
    assert (msg.content, msg.reasoning_content) == (ans.content, ans.reasoning)
    assert msg.tool_calls is None and res.choices[0].finish_reason == "stop"
    assert res.usage.completion_tokens == ans.completion_tokens
    assert res.usage.reasoning_tokens == ans.reasoning_tokens
    assert res.usage.completion_tokens_details.reasoning_tokens == ans.reasoning_tokens


def test_non_streaming_thinking_off_and_tools(sim):
    off = body("off", chat_template_kwargs={"thinking": False})
    res = create(sim.url, off)
    assert res.choices[0].message.reasoning_content is None
    assert res.choices[0].message.content == expected(off).content
    assert res.usage.reasoning_tokens == 0
    b = first_with_tools()
    ans = expected(b)
    res = create(sim.url, b)
    calls = res.choices[0].message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        (c.id, c.name, c.arguments) for c in ans.tool_calls
    ]
    assert res.choices[0].finish_reason == "tool_calls"


def test_separate_reasoning_false_puts_reasoning_in_content(sim):
    b = body("joined", separate_reasoning=False)
    ans = expected(b)
    res = create(sim.url, b)
    assert res.choices[0].message.content == f"{ans.reasoning}</think>{ans.content}"
    chunks = create(sim.url, {**b, "stream": True})
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == f"{ans.reasoning}</think>{ans.content}"


# ---- errors ----------------------------------------------------------------------------------


def test_wrong_model_is_404(sim):
    with pytest.raises(openai.NotFoundError) as info:
        create(sim.url, {**body("x"), "model": "nope"})
    assert "nope" in str(info.value)


def test_context_too_long_is_400_with_sglang_message(sim):
    with pytest.raises(openai.BadRequestError) as info:
        create(sim.url, body("long", max_tokens=4090))
    assert "maximum context length of 4096" in str(info.value)
    huge = body("huge " * 5000, max_tokens=1)
    with pytest.raises(openai.BadRequestError) as info:
        create(sim.url, huge)
    assert "longer than the model's context length" in str(info.value)


def test_token_ids_need_a_tokenizer_and_no_stream(sim):
    status, err = raw_post(sim.url, json.dumps(body("ids", return_token_ids=True)).encode())
    assert status == 400 and "--tokenizer" in err["message"]
    both = body("ids", return_prompt_token_ids=True, stream=True)
    status, err = raw_post(sim.url, json.dumps(both).encode())
    assert status == 400 and "stream" in err["message"]
    assert raw_post(sim.url, b"{not json")[0] == 400
    assert raw_post(sim.url, json.dumps({"model": MODEL, "messages": []}).encode())[0] == 400


# ---- stats -----------------------------------------------------------------------------------


def test_stats_count_keys_and_conversations(sim):
    b = body("counted twice")
    create(sim.url, b)
    create(sim.url, {**b, "stream": True})
    turn2 = {
        **b,
        "messages": [
            *b["messages"],
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "b"},
        ],
    }
    create(sim.url, turn2)
    st = sim.stats(keys=True)
    assert st["keys"][request_key(b)] == 2
    assert st["keys"][request_key(turn2)] == 1
    assert st["conversations"][conversation_key(b)] == 3
    assert st["completed"] >= 3 and st["tokens_generated"] >= st["completion_tokens"] > 0
    assert "keys" not in sim.stats()
    # refusals are counted per status: one request for a model it does not serve is one 404
    before = st["errors"].get("404", 0)
    assert raw_post(sim.url, json.dumps({**b, "model": "not-served"}).encode())[0] == 404
    assert sim.stats()["errors"].get("404", 0) == before + 1
