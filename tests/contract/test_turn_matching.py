"""`turns: all` tool turns with SGLang's own kimi_k2 parsers (from the 0.5.23 wheel): the calls
regen compares with the source's are what SGLang's reasoning and tool-call parsers return for
the model's text, streamed and not (parsed as tests/contract/test_kimi_parsers.py does).

A conversation whose original call is the one the model makes (the same JSON, other spacing)
continues with the original tool result re-addressed to SGLang's call id; another function or
other arguments end it at that turn, with the reason.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from test_kimi_parsers import ARGS, BEGIN, CALL, CALL_END, END, parse_streamed, parse_whole

from regen.core.result import TurnResult
from regen.core.sample import Message, Sample, ToolCall
from regen.engine.turns import TOOL_CALL_ARGUMENTS, TOOL_CALL_NAME, regenerate

#: what the model writes each turn after the prompt's open <think>
PRODUCED = (
    f"Look it up.</think>{BEGIN}{CALL}functions.get_weather:0{ARGS}"
    f'{{"city": "Oslo"}}{CALL_END}{END}'
)


@pytest.fixture(scope="module")
def tools(protocol):
    fn = protocol.Function(name="get_weather", parameters={
        "type": "object", "properties": {"city": {"type": "string"}}})  # fmt: skip
    return [protocol.Tool(function=fn)]


def conversation(name: str, args: str) -> Sample:
    orig = ToolCall("call_1", name, args)
    again = ToolCall("call_2", "get_weather", '{"city":"Oslo"}')
    return Sample("s:1", "s", [
        Message("user", "weather in Oslo?"),
        Message("assistant", "", tool_calls=(orig,)),
        Message("tool", "sunny", tool_call_id="call_1"),
        Message("assistant", "", tool_calls=(again,)),
        Message("tool", "still sunny", tool_call_id="call_2"),
        Message("assistant", "Sunny."),
    ])  # fmt: skip


@pytest.mark.parametrize("path", ["whole", "streamed"])
@pytest.mark.parametrize(
    ("name", "args", "turns", "ended"),
    [
        ("get_weather", '{"city":"Oslo"}', [0, 1, 2], None),
        ("get_forecast", '{"city": "Oslo"}', [0], TOOL_CALL_NAME),
        ("get_weather", '{"city": "Bergen"}', [0], TOOL_CALL_ARGUMENTS),
    ],
)
def test_turns_with_sglangs_parser(
    reasoning_parser, kimik2_detector, tools, path, name, args, turns, ended
) -> None:
    parse = parse_whole if path == "whole" else parse_streamed
    requests = []

    async def complete(messages, _tools) -> TurnResult:
        history = sum(len(m.get("tool_calls") or ()) for m in messages)
        requests.append(messages)
        reasoning, content, calls = parse(reasoning_parser, kimik2_detector, tools, PRODUCED,
                                          history)  # fmt: skip
        return TurnResult(content, reasoning, tuple(calls), "tool_calls", "m", "e")

    got = asyncio.run(regenerate(conversation(name, args), complete))
    assert [t.turn for t in got.turns] == turns and got.ended == ended
    first = got.turns[0].result.tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in first] == [("get_weather", {"city": "Oslo"})]
    if len(turns) > 1:  # the original result now answers SGLang's call id
        assert requests[1][-1]["tool_call_id"] == first[0].id == "functions.get_weather:0"
        assert got.turns[1].result.tool_calls[0].id == "functions.get_weather:1"
