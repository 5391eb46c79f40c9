"""Turn planning: on-policy history for `all`, original prefix for `last`, prompt-only."""

from __future__ import annotations

import asyncio
from typing import Any

from regen.engine.turns import regenerate
from regen.result import TurnResult
from regen.sample import Message, Sample, ToolCall


class FakeServer:
    """Answers 'reply N' and records every request."""

    def __init__(self, calls: list[list[ToolCall]] | None = None) -> None:
        self.requests: list[list[dict[str, Any]]] = []
        self.calls = calls or []

    async def __call__(self, messages, tools) -> TurnResult:
        n = len(self.requests)
        self.requests.append(messages)
        tc = tuple(self.calls[n]) if n < len(self.calls) else ()
        return TurnResult(f"reply {n}", f"think {n}", tc, "stop", "m", "e", 3, 2)


def conv(*pairs: tuple[str, str]) -> list[Message]:
    return [Message(role=r, content=c) for r, c in pairs]  # type: ignore[arg-type]


def test_all_turns_carry_our_replies() -> None:
    s = Sample("s:1", "s", conv(("user", "u0"), ("assistant", "a0"), ("user", "u1"),
                                ("assistant", "a1")))  # fmt: skip
    srv = FakeServer()
    turns = asyncio.run(regenerate(s, srv))
    assert [t.turn for t in turns] == [0, 1]
    assert srv.requests[0] == [{"role": "user", "content": "u0"}]
    assert srv.requests[1] == [
        {"role": "user", "content": "u0"},
        {"role": "assistant", "content": "reply 0", "reasoning_content": "think 0"},
        {"role": "user", "content": "u1"},
    ]
    assert turns[1].request_messages == srv.requests[1]


def test_last_keeps_original_prefix_and_tool_results() -> None:
    call = ToolCall("c1", "f", "{}")
    msgs = [
        Message("user", "u0"),
        Message("assistant", "a0", reasoning="r0", tool_calls=(call,)),
        Message("tool", "result", tool_call_id="c1"),
        Message("assistant", "a1"),
    ]
    srv = FakeServer()
    turns = asyncio.run(regenerate(Sample("s:2", "s", msgs, turns="last"), srv))
    assert len(turns) == 1 and turns[0].turn == 1
    assert srv.requests == [[m.to_openai() for m in msgs[:3]]]


def test_prompt_only_gets_one_turn() -> None:
    srv = FakeServer()
    turns = asyncio.run(regenerate(Sample("s:3", "s", conv(("system", "x"), ("user", "q"))), srv))
    assert len(turns) == 1 and len(srv.requests) == 1
    assert srv.requests[0][-1] == {"role": "user", "content": "q"}


def test_tool_results_readdressed_or_conversation_stopped() -> None:
    orig = ToolCall("orig", "f", "{}")
    msgs = [
        Message("user", "u"),
        Message("assistant", "", tool_calls=(orig,)),
        Message("tool", "42", tool_call_id="orig"),
        Message("assistant", "done"),
    ]
    ours = ToolCall("ours", "f", '{"x":1}')
    srv = FakeServer(calls=[[ours]])
    turns = asyncio.run(regenerate(Sample("s:4", "s", msgs), srv))
    assert len(turns) == 2
    assert srv.requests[1][-1] == {"role": "tool", "content": "42", "tool_call_id": "ours"}
    # no tool call in our reply: the original tool result answers nothing; stop there
    srv2 = FakeServer()
    turns2 = asyncio.run(regenerate(Sample("s:4", "s", msgs), srv2))
    assert len(turns2) == 1 and len(srv2.requests) == 1


def test_a_truncated_reply_ends_the_conversation() -> None:
    class Cut(FakeServer):
        async def __call__(self, messages, tools) -> TurnResult:
            r = await super().__call__(messages, tools)
            r.finish_reason = "length"
            return r

    s = Sample("s:5", "s", conv(("user", "u0"), ("assistant", "a0"), ("user", "u1"),
                                ("assistant", "a1")))  # fmt: skip
    srv = Cut()
    turns = asyncio.run(regenerate(s, srv))
    assert [t.turn for t in turns] == [0] and len(srv.requests) == 1


def test_unanswered_tool_calls_end_the_conversation() -> None:
    s = Sample("s:6", "s", conv(("user", "u0"), ("assistant", "a0"), ("user", "u1"),
                                ("assistant", "a1")))  # fmt: skip
    srv = FakeServer(calls=[[ToolCall("ours", "f", "{}")]])
    turns = asyncio.run(regenerate(s, srv))
    assert [t.turn for t in turns] == [0] and len(srv.requests) == 1
