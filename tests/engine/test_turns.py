"""Turn planning: on-policy history for `all` (tool turns continue only on matching calls),
original prefix for `last`, prompt-only."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from regen.core.result import TurnResult
from regen.core.sample import Message, Sample, ToolCall
from regen.engine import turns as T
from regen.engine.turns import call_mismatch, regenerate


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
    turns = asyncio.run(regenerate(s, srv)).turns
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
    turns = asyncio.run(regenerate(Sample("s:2", "s", msgs, turns="last"), srv)).turns
    assert len(turns) == 1 and turns[0].turn == 1
    assert srv.requests == [[m.to_openai() for m in msgs[:3]]]


def test_prompt_only_gets_one_turn() -> None:
    srv = FakeServer()
    turns = asyncio.run(
        regenerate(Sample("s:3", "s", conv(("system", "x"), ("user", "q"))), srv)
    ).turns
    assert len(turns) == 1 and len(srv.requests) == 1
    assert srv.requests[0][-1] == {"role": "user", "content": "q"}


TOOL_MSGS = [
    Message("user", "u"),
    Message("assistant", "", tool_calls=(ToolCall("orig", "f", '{"x": 1, "y": [2, 3]}'),)),
    Message("tool", "42", tool_call_id="orig"),
    Message("assistant", "done"),
]


def test_matching_calls_continue_with_results_readdressed() -> None:
    # the same name and the same arguments as parsed JSON (other key order, no spaces)
    ours = ToolCall("ours", "f", '{"y":[2,3],"x":1}')
    srv = FakeServer(calls=[[ours]])
    got = asyncio.run(regenerate(Sample("s:4", "s", TOOL_MSGS), srv))
    assert len(got.turns) == 2 and got.ended is None
    assert srv.requests[1][-1] == {"role": "tool", "content": "42", "tool_call_id": "ours"}


@pytest.mark.parametrize(
    ("calls", "why"),
    [
        ([ToolCall("ours", "g", '{"x": 1, "y": [2, 3]}')], T.TOOL_CALL_NAME),
        ([ToolCall("ours", "f", '{"x": 2, "y": [2, 3]}')], T.TOOL_CALL_ARGUMENTS),
        ([ToolCall("ours", "f", '{"x": 1, "y": [3, 2]}')], T.TOOL_CALL_ARGUMENTS),
        ([ToolCall("ours", "f", '{"x": 1}')], T.TOOL_CALL_ARGUMENTS),
        ([ToolCall("a", "f", '{"x": 1, "y": [2, 3]}')] * 2, T.TOOL_CALL_COUNT),
        ([], T.TOOL_CALLS_MISSING),
    ],
)
def test_mismatched_calls_end_the_conversation_with_the_reason(calls, why) -> None:
    srv = FakeServer(calls=[calls])
    got = asyncio.run(regenerate(Sample("s:4", "s", TOOL_MSGS), srv))
    assert [t.turn for t in got.turns] == [0] and len(srv.requests) == 1
    assert got.ended == why


def test_mismatch_at_the_last_turn_loses_nothing() -> None:
    msgs = TOOL_MSGS[:3]  # the conversation ends with the tool result: no later turn to lose
    srv = FakeServer(calls=[[ToolCall("ours", "g", "{}")]])
    got = asyncio.run(regenerate(Sample("s:7", "s", msgs), srv))
    assert len(got.turns) == 1 and got.ended is None


def test_arguments_that_are_not_json_compare_as_text() -> None:
    assert call_mismatch([ToolCall("a", "f", "not json")], [ToolCall("b", "f", "not json")]) is None
    assert call_mismatch([ToolCall("a", "f", "not json")], [ToolCall("b", "f", '"not json"')]) == (
        T.TOOL_CALL_ARGUMENTS
    )


def test_a_truncated_reply_ends_the_conversation() -> None:
    class Cut(FakeServer):
        async def __call__(self, messages, tools) -> TurnResult:
            r = await super().__call__(messages, tools)
            r.finish_reason = "length"
            return r

    s = Sample("s:5", "s", conv(("user", "u0"), ("assistant", "a0"), ("user", "u1"),
                                ("assistant", "a1")))  # fmt: skip
    srv = Cut()
    got = asyncio.run(regenerate(s, srv))
    assert [t.turn for t in got.turns] == [0] and len(srv.requests) == 1
    assert got.ended is None  # counted as truncated, not as an ended conversation


def test_unanswered_tool_calls_end_the_conversation() -> None:
    s = Sample("s:6", "s", conv(("user", "u0"), ("assistant", "a0"), ("user", "u1"),
                                ("assistant", "a1")))  # fmt: skip
    srv = FakeServer(calls=[[ToolCall("ours", "f", "{}")]])
    got = asyncio.run(regenerate(s, srv))
    assert [t.turn for t in got.turns] == [0] and len(srv.requests) == 1
    assert got.ended == T.TOOL_CALLS_UNEXPECTED
