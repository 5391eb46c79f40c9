"""A server's answers, broken at random, through the client's real transport (issue 42, item 2).

One scripted server on 127.0.0.1 (tests/_scripted.py) plays each example; a ``ChatClient``
with SGLang's or vLLM's profile asks it once, streamed or not. The answers start as each
engine writes them (SGLang: role, text, tool-call and finish chunks, then ``sglext`` with the
ids and the usage chunk; vLLM: ``prompt_token_ids`` on the first chunk and ``token_ids`` on
each choice), then are broken: cut at any byte, an event replaced by any JSON value, an event
mutated (a field of the wrong type: ``sglext``, ``token_ids``, ``usage``, a delta, a tool
call), a line of invalid UTF-8, a huge line. Each gives a ``TurnResult`` or a typed regen
``RequestError``, never another exception, and a ``TurnResult`` only for an answer whose
finish chunk arrived whole: its texts are text, its ids lists of ints or None.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from _chat_fakes import MESSAGES, make_client
from _hostile import hostile_value, mutated, text
from _scripted import SSE_HEADERS, Cut, Reply, ScriptedServer
from hypothesis import event, given
from hypothesis import strategies as st

from regen.client.chat import FINISHED
from regen.client.profiles import SGLANG, VLLM
from regen.client.profiles.base import EngineProfile
from regen.core.errors import RequestError
from regen.core.result import TurnResult
from regen.manifest import Sampling

TOOLS = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    script = ScriptedServer(Reply())
    with script.running():
        yield script


def _chunk(delta: dict[str, Any] | None, finish: str | None = None, **top: Any) -> dict[str, Any]:
    """A chunk of one choice with ``delta`` (None: a chunk without choices, SGLang's last ones)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices, **top}  # fmt: skip


@st.composite
def answers(draw: st.DrawFn, engine: str) -> list[dict[str, Any]]:
    """The events of one well-formed streamed answer as ``engine`` writes them."""
    reasoning = draw(st.lists(text, max_size=3))
    content = draw(st.lists(text, max_size=4))
    calls = draw(
        st.lists(
            st.tuples(
                st.from_regex(r"[a-z]{1,6}", fullmatch=True),
                st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
            ),
            max_size=2,
        )
    )
    finish = draw(st.sampled_from(["stop", "length", "tool_calls"]))
    ids = draw(st.lists(st.integers(0, 2000), min_size=1, max_size=12))
    vllm = engine == "vllm"
    out = [
        _chunk({"role": "assistant", "content": ""}, **({"prompt_token_ids": ids} if vllm else {}))
    ]
    out += [_chunk({"reasoning_content": t}) for t in reasoning]
    out += [_chunk({"content": t}) for t in content]
    for i, (name, args) in enumerate(calls):
        out.append(
            _chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": f"call_{i}",
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            )
        )
        out.append(
            _chunk({"tool_calls": [{"index": i, "function": {"arguments": json.dumps(args)}}]})
        )
    if vllm:
        for c in out[1:]:
            c["choices"][0]["token_ids"] = draw(st.lists(st.integers(0, 2000), max_size=2))
    out.append(_chunk({}, finish))
    if not vllm:
        out.append(_chunk(None, sglext={"input_ids": ids, "output_ids": [ids[:3]]}))
    usage = {"prompt_tokens": len(ids), "completion_tokens": 3, "total_tokens": len(ids) + 3}
    out.append(_chunk(None, usage=usage))
    return out


def whole(engine: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    """The non-streamed answer with the same parts."""
    msg: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": []}
    choice: dict[str, Any] = {"index": 0, "message": msg, "finish_reason": None}
    data: dict[str, Any] = {
        "id": "c",
        "object": "chat.completion",
        "model": "m",
        "choices": [choice],
    }
    for e in events:
        for c in e.get("choices") or ():
            d = c["delta"]
            msg["content"] += d.get("content") or ""
            if d.get("reasoning_content"):
                msg["reasoning_content"] = msg.get("reasoning_content", "") + d["reasoning_content"]
            for tc in d.get("tool_calls") or ():
                if "id" in tc:
                    msg["tool_calls"].append(tc)
            choice["finish_reason"] = c["finish_reason"] or choice["finish_reason"]
        if "usage" in e:
            data["usage"] = e["usage"]
    if engine == "vllm":
        data["prompt_token_ids"] = events[0].get("prompt_token_ids")
        choice["token_ids"] = [1, 2, 3]
    else:
        choice["prompt_token_ids"] = [1, 2]
        choice["response_token_ids"] = [3, 4]
    return data


def sse(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n\n" for line in lines)


def _line(event: Any) -> bytes:
    return b"data: " + json.dumps(event, ensure_ascii=False).encode("utf-8", "surrogatepass")


@st.composite
def broken_stream(draw: st.DrawFn, engine: str) -> tuple[bytes, bool]:
    """(the bytes the server sends, whether it then drops the connection)."""
    events: list[Any] = draw(answers(engine))
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(events) - 1))
        how = draw(st.sampled_from(["replace", "mutate", "mutate", "drop"]))
        if how == "replace":
            events[at] = draw(hostile_value())
        elif how == "mutate":
            events[at] = draw(mutated(events[at], most=2))
        else:
            events.pop(at)
    lines = [_line(e) for e in events] + [b"data: [DONE]"]
    extra = draw(st.sampled_from(["none", "none", "utf8", "huge", "garbage"]))
    at = draw(st.integers(0, len(lines)))
    if extra == "utf8":
        lines.insert(at, b'data: {"choices": [{"delta": {"content": "\xff\xfe\xc3"}}]}')
    elif extra == "huge":
        lines.insert(
            at, b'data: {"choices": [{"delta": {"content": "' + b"a" * 3_000_000 + b'"}}]}'
        )
    elif extra == "garbage":
        lines.insert(at, draw(st.binary(max_size=40)).replace(b"\n", b" "))
    body = sse(lines)
    if draw(st.booleans()):
        return body[: draw(st.integers(0, len(body)))], True
    return body, False


def ask(server: ScriptedServer, profile: EngineProfile, token_ids: str) -> TurnResult:
    client = make_client(server.url, engine=profile, sampling=Sampling(token_ids=token_ids))

    async def go() -> TurnResult:
        try:
            return await client.complete_once(MESSAGES, TOOLS, sample_id="s:1")
        finally:
            await client.aclose()

    return asyncio.run(go())


def check(server: ScriptedServer, profile: EngineProfile, token_ids: str, sent: bytes) -> None:
    try:
        result = ask(server, profile, token_ids)
    except RequestError as e:
        event(type(e).__name__)
        return
    event("a turn")
    assert isinstance(result, TurnResult)
    assert result.finish_reason in FINISHED
    assert f'"finish_reason": "{result.finish_reason}"'.encode() in sent, "no finish arrived"
    for value in (result.content, result.reasoning or ""):
        assert isinstance(value, str)
        value.encode("utf-8")
    for c in result.tool_calls:
        for value in (c.id, c.name, c.arguments):
            assert isinstance(value, str)
            value.encode("utf-8")
    for ids in (result.prompt_token_ids, result.output_token_ids):
        assert ids is None or all(type(x) is int for x in ids)
    for n in (result.prompt_tokens, result.completion_tokens, result.cached_tokens):
        assert n is None or type(n) is int


@pytest.mark.parametrize("profile", [SGLANG, VLLM], ids=["sglang", "vllm"])
@given(data=st.data())
def test_streams_broken_at_random(
    server: ScriptedServer, profile: EngineProfile, data: st.DataObject
) -> None:
    body, cut = data.draw(broken_stream(profile.name))
    server.steps = [Cut(body) if cut else Reply(200, body, SSE_HEADERS)]
    check(server, profile, "stream", body)


@pytest.mark.parametrize("profile", [SGLANG, VLLM], ids=["sglang", "vllm"])
@given(data=st.data())
def test_whole_answers_broken_at_random(
    server: ScriptedServer, profile: EngineProfile, data: st.DataObject
) -> None:
    answer = data.draw(answers(profile.name).map(lambda e: whole(profile.name, e)).flatmap(mutated))
    body = json.dumps(answer, ensure_ascii=False).encode("utf-8", "surrogatepass")
    server.steps = [Reply(200, body)]
    check(server, profile, "nonstream", body)
