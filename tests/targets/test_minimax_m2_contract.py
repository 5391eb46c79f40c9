"""MiniMax-M2's text round trip through both engines' own parsers: the text the model writes
after ``]~b]ai\\n<think>\\n`` → SGLang 0.5.23 (``minimax`` reasoning, ``minimax-m2`` tools) or
vLLM 0.32 (``minimax_m2`` reasoning and tools, the parser its chat serving composes) →
(reasoning, content, calls) → ``MINIMAX_M2.response_text`` → the same text, and the same ids
through a tokenizer holding M2's special tokens; where an engine loses whitespace or a value,
the case says which. Also: the vendored template's generation prompt leaves the reasoning open,
and the rebuilt answer is what the template writes for the same turn in the history."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _engines import (
    TIME,
    Case,
    check,
    rebuild,
    same_ids,
    sglang,
    sglang_parse,
    strip_end,
    vllm_parse,
    vllm_round_trip,
)
from jinja2.sandbox import ImmutableSandboxedEnvironment

from regen.core.sample import ToolCall
from regen.targets.minimax_m2 import MINIMAX_M2, SPECIAL_TOKENS

END = "[e~["
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "note": {"type": ["string", "null"]}}}}}  # fmt: skip
TOOLS = [WEATHER, TIME]
R = "The user asks the weather.\n</think>\n\n"


def block(*invokes: str) -> str:
    return "\n<minimax:tool_call>\n" + "".join(invokes) + "</minimax:tool_call>"


def invoke(name: str, **params: str) -> str:
    body = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in params.items())
    return f'<invoke name="{name}">\n{body}</invoke>\n'


W, T = invoke("get_weather", city="Oslo"), invoke("get_time", zone="CET")
CASES = {
    "reasoning and answer": Case(f"{R}It is sunny.{END}", "open"),
    "an answer ending in a newline": Case(f"{R}It is sunny.\nBye.\n{END}", "open"),
    "one call": Case(f"{R}{block(W)}{END}", "open", calls=1),
    "two calls": Case(f"{R}{block(W, T)}{END}", "open", calls=2),
    "content before a call": Case(f"{R}Let me check.{block(W)}{END}", "open", calls=1),
    "a call without arguments": Case(f"{R}{block(invoke('get_time'))}{END}", "open", calls=1),
    "cut in the reasoning": Case("The user asks", "open", finish="length"),
    "cut in the answer": Case(f"{R}It is su", "open", finish="length"),
    "a value on its own lines": Case(
        f"{R}{block(invoke('get_weather', city=chr(10) + 'Oslo' + chr(10)))}{END}", "open",
        calls=1, sglang_differs="SGLang trims the newlines around a value"),
    "the text 'none' as a string value": Case(
        f"{R}{block(invoke('get_weather', city='none'))}{END}", "open", calls=1,
        sglang_differs="SGLang reads null/none/nil as None whatever the schema says"),
    "reasoning ending in a space": Case(f"The user asks. \n</think>\n\nSunny.{END}", "open",
        vllm_differs="vLLM rstrips the reasoning"),
    "text after the calls": Case(f"{R}{block(W)}\nDone.{END}", "open", calls=1,
        sglang_differs="SGLang appends text after the calls to the content",
        vllm_differs="vLLM drops text after the calls"),
    "typed values": Case(f"{R}{block(invoke('get_weather', city='Oslo', days='3'))}{END}",
        "open", calls=1),
    "a parameter that may be null": Case(
        f"{R}{block(invoke('get_weather', city='Oslo', note='windy'))}{END}", "open", calls=1,
        sglang_differs="SGLang returns None for every value of a parameter whose schema "
                       "admits null"),
    "content before a call, spaced": Case(f"{R}Let me check.\n\n{block(W)}{END}", "open",
        calls=1,
        sglang_differs="the rebuild strips the content before a call (the template's form)",
        vllm_differs="vLLM strips the content before a call"),
}  # fmt: skip
SPECIAL = list(SPECIAL_TOKENS)
TEMPLATES = Path(__file__).resolve().parents[2] / "regen/devkit/tokenizers/templates"
TEMPLATE = TEMPLATES / "minimax_m2.jinja"


def sglang_round_trip(case: Case) -> str:
    """The case through SGLang's parsers (``minimax`` always forces the reasoning open) with
    :data:`TOOLS`, and back."""
    detector = sglang("function_call.minimax_m2").MinimaxM2Detector()
    reasoning, content, calls = sglang_parse(
        strip_end(MINIMAX_M2, case.text), MINIMAX_M2.sglang.reasoning, detector, tools=TOOLS
    )
    assert len(calls) == case.calls or case.sglang_differs, (reasoning, content, calls)
    return rebuild(MINIMAX_M2, case, reasoning, content, calls)


@pytest.mark.parametrize("name", list(CASES))
def test_sglang_round_trip(name: str) -> None:
    case = CASES[name]
    check(case, sglang_round_trip(case), case.sglang_differs)


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, dict]:
    found = vllm_parse(MINIMAX_M2, list(CASES.values()), SPECIAL, composed=True, tools=TOOLS)
    return dict(zip(CASES, found, strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_round_trip(vllm_results, name: str) -> None:
    case = CASES[name]
    check(case, vllm_round_trip(MINIMAX_M2, case, vllm_results[name]), case.vllm_differs)


def test_vllm_keeps_special_tokens(vllm_results) -> None:
    """vLLM's M2 parser turns ``skip_special_tokens`` off (SGLang does only for requests with
    tools): the markers reach the parsers even where they are special tokens."""
    assert {r["skip_special_tokens"] for r in vllm_results.values()} == {False}


def test_ids_of_the_rebuilt_text() -> None:
    for name, case in CASES.items():
        if not case.sglang_differs:
            assert same_ids(SPECIAL, case.text, sglang_round_trip(case)), name


def raise_exception(message: str) -> None:
    raise ValueError(message)


def render(messages: list[dict], **kwargs) -> str:
    """The vendored template rendered as transformers renders it (blocks trimmed, ``tojson``
    with the default separators)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v, ensure_ascii=True: json.dumps(v, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(TEMPLATE.read_text(encoding="utf-8")).render(messages=messages, **kwargs)


def test_the_template_always_opens_the_reasoning() -> None:
    prompt = render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert prompt.endswith("]~b]user\nHi[e~[\n]~b]ai\n<think>\n")
    assert MINIMAX_M2.think_state(prompt) == "open"
    assert MINIMAX_M2.template_kwargs(True) == {} == MINIMAX_M2.template_kwargs(False)


def test_the_rebuild_is_what_the_template_writes_in_the_history() -> None:
    """An answer with reasoning, content and calls (a string, a number, an object) rebuilt, and
    the same turn as the last assistant message of a rendered conversation."""
    calls = [ToolCall("call_0", "get_weather", '{"city": "Oslo", "n": 2, "o": {"u": "C"}}'),
             ToolCall("call_1", "get_time", "{}")]  # fmt: skip
    rebuilt = MINIMAX_M2.response_text("open", "Two lookups.", "Let me check.", calls)
    history = render([
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "Two lookups.",
         "tool_calls": [{"type": "function", "function": {"name": c.name,
                         "arguments": json.loads(c.arguments)}} for c in calls]},
    ])  # fmt: skip
    assert history.endswith("]~b]ai\n<think>\n" + rebuilt + "\n")
