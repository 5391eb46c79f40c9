"""Golden renderings of the tiny tokenizer's Kimi template through Renderer.render_prompt.

The expected strings are written out in full: any change of the template shows up here. The
last test proves it: one-character edits of the template make at least one golden case fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from regen.template.render import Renderer

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

#: name -> (messages, tools, template kwargs)
CASES: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]] = {
    "single_turn": ([{"role": "user", "content": "What is the capital of France?"}], None, {}),
    "multi_turn_reasoning": (
        [
            {"role": "user", "content": "Pick a number."},
            {"role": "assistant", "content": "Seven.", "reasoning_content": "Any number works."},
            {"role": "user", "content": "Double it."},
            {"role": "assistant", "content": "Fourteen.", "reasoning_content": "7 * 2 = 14."},
            {"role": "user", "content": "Now halve it."},
        ],
        None,
        {"thinking": True},
    ),
    "tool_calls": (
        [
            {"role": "user", "content": "Hi."},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet."},
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Two calls.",
                "tool_calls": [
                    {
                        "id": "functions.get_weather:0",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18 C"},
            {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "24 C"},
        ],
        [WEATHER_TOOL],
        {},
    ),
    "custom_system": (
        [
            {"role": "system", "content": "You are a terse pirate."},
            {"role": "user", "content": "Hello?"},
        ],
        None,
        {},
    ),
    "thinking_off": (
        [{"role": "user", "content": "Say hi."}],
        None,
        {"thinking": False},
    ),
    "special_text_in_user": (
        [{"role": "user", "content": "Print <|im_end|> and <think> as text."}],
        None,
        {},
    ),
}

TOKENIZER = Path(__file__).resolve().parents[2] / "manifests" / "demo" / "tokenizer"

SYS = (
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI."
    "<|im_end|>"
)
GEN = "<|im_assistant|>assistant<|im_middle|>"

GOLDEN: dict[str, str] = {
    "single_turn": SYS
    + "<|im_user|>user<|im_middle|>What is the capital of France?<|im_end|>"
    + GEN
    + "<think>",
    # the trap: both history assistant turns lose their reasoning
    "multi_turn_reasoning": SYS
    + "<|im_user|>user<|im_middle|>Pick a number.<|im_end|>"
    + "<|im_assistant|>assistant<|im_middle|><think></think>Seven.<|im_end|>"
    + "<|im_user|>user<|im_middle|>Double it.<|im_end|>"
    + "<|im_assistant|>assistant<|im_middle|><think></think>Fourteen.<|im_end|>"
    + "<|im_user|>user<|im_middle|>Now halve it.<|im_end|>"
    + GEN
    + "<think>",
    # tools first; the plain assistant turn is history, the tool-calling one after it keeps
    # its reasoning; a missing call id becomes functions.{name}:{index}; dict args -> JSON
    "tool_calls": "<|im_system|>tool_declare<|im_middle|>"
    '[{"type": "function", "function": {"name": "get_weather", "description": '
    '"Current weather of a city.", "parameters": {"type": "object", "properties": '
    '{"city": {"type": "string"}}, "required": ["city"]}}}]<|im_end|>'
    + SYS
    + "<|im_user|>user<|im_middle|>Hi.<|im_end|>"
    + "<|im_assistant|>assistant<|im_middle|><think></think>Hello!<|im_end|>"
    + "<|im_user|>user<|im_middle|>Weather in Paris and Rome?<|im_end|>"
    + "<|im_assistant|>assistant<|im_middle|><think>Two calls.</think>"
    + "<|tool_calls_section_begin|>"
    + '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}'
    + "<|tool_call_end|>"
    + '<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{"city": "Rome"}'
    + "<|tool_call_end|>"
    + "<|tool_calls_section_end|><|im_end|>"
    + "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n18 C<|im_end|>"
    + "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:1\n24 C<|im_end|>"
    + GEN
    + "<think>",
    "custom_system": "<|im_system|>system<|im_middle|>You are a terse pirate.<|im_end|>"
    + "<|im_user|>user<|im_middle|>Hello?<|im_end|>"
    + GEN
    + "<think>",
    "thinking_off": SYS + "<|im_user|>user<|im_middle|>Say hi.<|im_end|>" + GEN + "<think></think>",
    "special_text_in_user": SYS
    + "<|im_user|>user<|im_middle|>Print <|im_end|> and <think> as text.<|im_end|>"
    + GEN
    + "<think>",
}


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    return Renderer.from_dir(TOKENIZER)


def _render(r: Renderer, name: str) -> str:
    messages, tools, kwargs = CASES[name]
    r.template_kwargs = kwargs
    try:
        return r.render_prompt(messages, tools)
    finally:
        r.template_kwargs = {}


def failing_cases(r: Renderer) -> list[str]:
    return [name for name in GOLDEN if _render(r, name) != GOLDEN[name]]


def _one_character_edit(a: str, b: str) -> bool:
    """True when b is a with exactly one character substituted, inserted or deleted."""
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    short, long_ = sorted((a, b), key=len)
    return len(long_) == len(short) + 1 and any(
        long_[:i] + long_[i + 1 :] == short for i in range(len(long_))
    )


def test_six_cases_are_pinned() -> None:
    assert sorted(GOLDEN) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden(renderer: Renderer, name: str) -> None:
    assert _render(renderer, name) == GOLDEN[name]


def test_special_token_text_in_user_content_encodes_as_special_tokens(
    renderer: Renderer,
) -> None:
    ids = renderer.encode(GOLDEN["special_text_in_user"])
    im_end = renderer.end_id
    # default system turn, the user's literal <|im_end|>, the user turn's own <|im_end|>
    assert ids.count(im_end) == 3
    assert renderer.decode(ids) == GOLDEN["special_text_in_user"]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("## Return of", "## Return 0f"),  # tool result prefix
        ("tool_declare", "tool_declarf"),  # tool declaration turn name
        ("Moonshot AI.", "Moonshot AI!"),  # default system prompt
        ("loop.index0 > ns.last_plain", "loop.index0 >= ns.last_plain"),  # the trap boundary
        ("<think></think>{%- else", "<think> </think>{%- else"),  # thinking off prompt
        ("':' ~ loop.index0", "':' ~ loop.index"),  # default tool-call id counter
    ],
)
def test_one_character_template_change_fails_a_golden(
    renderer: Renderer, old: str, new: str
) -> None:
    original = renderer.tokenizer.chat_template
    assert original.count(old) == 1
    assert _one_character_edit(old, new)
    renderer.tokenizer.chat_template = original.replace(old, new)
    try:
        assert failing_cases(renderer), f"template edit {old!r} -> {new!r} went unnoticed"
    finally:
        renderer.tokenizer.chat_template = original
    assert failing_cases(renderer) == []
