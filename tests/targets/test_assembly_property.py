"""Each family's response assembly and the tool-call argument parsing on any answer (issue 42,
item 2): the text the model produced after a prompt (reasoning, content, tool calls, finish
reason, after a prompt that left the reasoning open, closed it or has none) is a ``str`` or a
``TemplateError`` saying why the family cannot write it, never another exception; a history
call's arguments, whatever their text (not JSON, not an object, nested too deeply, huge), come
back as each engine hands them to the template or as an ``ArgumentsError``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _hostile import text
from hypothesis import given
from hypothesis import strategies as st

from regen.core.errors import ArgumentsError, TemplateError
from regen.core.sample import Message, ToolCall
from regen.targets import FAMILIES, Family
from regen.targets.family import arguments_json
from regen.template.prepare import PREPARATIONS, parse_arguments, preparation

#: arguments a model or a source may write
ARGUMENTS = st.one_of(
    st.dictionaries(st.text(max_size=6), st.one_of(st.integers(), text), max_size=3).map(
        json.dumps
    ),
    text,
    st.sampled_from(["", "{", "[]", "null", "1", '"x"', "[" * 5000 + "]" * 5000,
                     '{"a": ' * 3000 + "1" + "}" * 3000, '{"a": NaN}', '{"a": 1e999}']),
)  # fmt: skip
calls = st.lists(
    st.builds(ToolCall, id=st.text(max_size=8), name=st.text(max_size=10), arguments=ARGUMENTS),
    max_size=3,
)


@pytest.mark.parametrize("family", list(FAMILIES.values()), ids=list(FAMILIES))
def test_response_text_is_text_or_a_template_error(family: Family) -> None:
    @given(
        state=st.sampled_from(["open", "closed", "none"]),
        reasoning=st.one_of(st.none(), text),
        content=text,
        tool_calls=calls,
        finish=st.sampled_from(["stop", "length", "tool_calls"]),
    )
    def prop(state: Any, reasoning: str | None, content: str, tool_calls: list[ToolCall],
             finish: str) -> None:  # fmt: skip
        try:
            out = family.response_text(state, reasoning, content, tool_calls, finish)
        except TemplateError:
            return
        assert isinstance(out, str)
        split = family.split_response(state, reasoning, content)
        assert isinstance(split[1], str)

    prop()


@given(ARGUMENTS, st.sampled_from(["empty", "keep", "refuse"]))
def test_history_arguments_parse_as_the_engines_hand_them(raw: str, rule: Any) -> None:
    try:
        value = parse_arguments(raw, rule, "f")
    except ArgumentsError:
        assert rule == "refuse"
        return
    assert isinstance(value, dict) or (rule == "keep" and value == raw)
    arguments_json(raw)


@pytest.mark.parametrize("engine", [None, *PREPARATIONS])
def test_every_engines_preparation_of_a_history_call(engine: str | None) -> None:
    prep = preparation(engine)

    @given(calls.filter(bool))
    def prop(history: list[ToolCall]) -> None:
        msgs = [Message("user", "q"), Message("assistant", "", tool_calls=tuple(history)),
                Message("tool", "r", tool_call_id="x", name="n")]  # fmt: skip
        try:
            out = prep.messages(msgs)
        except TemplateError:
            return
        for call in out[1]["tool_calls"]:
            json.dumps(call["function"]["arguments"], default=str)

    prop()
