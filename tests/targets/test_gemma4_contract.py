"""Gemma 4's text round trip through both engines' own parsers: the text the model writes after
its generation prompt → SGLang 0.5.23 (``gemma4`` reasoning, forced open when
``enable_thinking`` is true as its server does, then the ``gemma4`` detector) or vLLM 0.32 (the
parser its chat serving composes from ``gemma4`` / ``gemma4``) → (reasoning, content, calls) →
``GEMMA4.response_text`` → the same text, and the same ids through a tokenizer holding Gemma 4's
special tokens; where an engine loses something the case names it. Also: the think state of
prompts the vendored official template renders, Gemma's argument syntax, recognition.

vLLM gets the tools with a typed schema (:data:`TYPED`): it types bare values by the schema;
SGLang types them by their text and ignores the schema.
"""

from __future__ import annotations

import pytest
from _engines import Case, check, same_ids, sglang, sglang_round_trip, vllm_parse, vllm_round_trip
from _families import family_tokenizer

from regen.core.sample import ToolCall
from regen.targets import FAMILIES, read_facts
from regen.targets.family import TokenizerFacts
from regen.targets.gemma4 import (
    GEMMA4,
    PUBLISHED_IDS,
    SPECIAL_TOKENS,
    arguments_text,
    value_text,
)
from regen.template.render import Renderer
from regen.template.tokenizer import load_tokenizer

ON, OFF = {"enable_thinking": True}, {"enable_thinking": False}
Q = '<|"|>'
E, R = "<turn|>", "<|tool_response>"
W = f"<|tool_call>call:get_weather{{city:{Q}Oslo{Q}}}<tool_call|>"
T = f"<|tool_call>call:get_time{{zone:{Q}CET{Q}}}<tool_call|>"
THINK = "<|channel>thought\nThe user asks the weather.\n<channel|>"
#: a call with every kind of value, keys not sorted (the model's order)
TYPED_CALL = (
    f"<|tool_call>call:get_weather{{days:2,city:{Q}Oslo{Q},metric:true,"
    f"opts:{{unit:{Q}C{Q},hours:[6,12]}},note:null}}<tool_call|>"
)
#: the tools vLLM gets: the cases' names, with typed parameters
TYPED = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "metric": {"type": "boolean"}, "note": {"type": ["string", "null"]},
            "opts": {"type": "object", "properties": {
                "unit": {"type": "string"},
                "hours": {"type": "array", "items": {"type": "integer"}}}},
        }}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}}}},
]  # fmt: skip
STRIPPED = "vLLM strips the content before a call"
TRAP = "SGLang forces the reasoning open with enable_thinking: the whole answer is reasoning"
CASES = {
    "thinking off": Case(f"It is sunny.{E}", "closed", kwargs=OFF),
    "reasoning and answer": Case(f"{THINK}It is sunny.{E}", kwargs=ON),
    "one call": Case(f"{THINK}{W}{R}", calls=1, kwargs=ON),
    "two calls": Case(f"{THINK}{W}{T}{R}", calls=2, kwargs=ON),
    "content before a call": Case(f"{THINK}Let me check.{W}{R}", calls=1, kwargs=ON),
    "a call, thinking off": Case(f"Let me check.{W}{R}", "closed", calls=1, kwargs=OFF),
    "cut in the reasoning": Case("<|channel>thought\nThe user asks", finish="length", kwargs=ON),
    "cut in the answer": Case(f"{THINK}It is su", finish="length", kwargs=ON),
    "every kind of value, the model's key order": Case(
        f"{TYPED_CALL}{R}", "closed", calls=1, kwargs=OFF,
        sglang_differs="SGLang returns a bare null as the string 'null' (quoted in the rebuild)",
    ),
    "an older template's open channel (after a tool result)": Case(
        f"The user asks the weather.\n<channel|>It is sunny.{E}", "open", kwargs=ON
    ),
    "reasoning without a newline before <channel|>": Case(
        f"<|channel>thought\nThe user asks.<channel|>It is sunny.{E}", kwargs=ON,
        sglang_differs="the rebuild writes the template's \\n before <channel|>",
        vllm_differs="the rebuild writes the template's \\n before <channel|>",
    ),
    "an empty thought channel": Case(
        f"<|channel>thought\n<channel|>It is sunny.{E}", kwargs=ON,
        sglang_differs="the server reports no reasoning: the channel is not rebuilt",
        vllm_differs="no reasoning is returned: the channel is not rebuilt",
    ),
    "thinking on, no thought channel": Case(
        f"It is sunny.{E}", kwargs=ON, sglang_differs=TRAP
    ),  # vLLM reads it as content
    "thinking on, a call without a thought channel": Case(
        f"Let me check.{W}{R}", calls=1, kwargs=ON,
        sglang_differs=f"{TRAP}, its call unparsed",
    ),
    "a newline before a call": Case(
        f"Let me check.\n{W}{R}", "closed", calls=1, kwargs=OFF, vllm_differs=STRIPPED
    ),
    "text after the call": Case(
        f"{W}Done.{R}", "closed", calls=1, kwargs=OFF,
        sglang_differs="SGLang's content is the text before the first call",
        vllm_differs="vLLM drops the text after a call",
    ),
    "a bare value no schema types": Case(
        f"<|tool_call>call:get_weather{{city:{Q}Oslo{Q},hourly:true}}<tool_call|>{R}", "closed",
        calls=1, kwargs=OFF, vllm_differs="vLLM returns an untyped bare value as a string",
    ),
    "a number's spelling": Case(
        f"<|tool_call>call:get_weather{{days:2.50}}<tool_call|>{R}", "closed", calls=1,
        kwargs=OFF, sglang_differs="SGLang reads 2.50 as the float 2.5",
        vllm_differs="vLLM reads 2.50 as the number 2.5",
    ),
    "ended by <eos>": Case(
        "It is sunny.<eos>", "closed", kwargs=OFF,
        sglang_differs="the end token is not returned: the rebuild writes <turn|>",
        vllm_differs="the end token is not returned: the rebuild writes <turn|>",
    ),
}  # fmt: skip
SPECIAL = list(PUBLISHED_IDS)


@pytest.fixture(scope="module")
def detector():
    return sglang("function_call.gemma4_detector").Gemma4Detector()


@pytest.mark.parametrize("name", list(CASES))
def test_sglang_round_trip(detector, name: str) -> None:
    case = CASES[name]
    check(case, sglang_round_trip(GEMMA4, case, detector), case.sglang_differs)


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, dict]:
    results = vllm_parse(GEMMA4, list(CASES.values()), SPECIAL, composed=True, tools=TYPED)
    return dict(zip(CASES, results, strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_round_trip(vllm_results, name: str) -> None:
    case = CASES[name]
    check(case, vllm_round_trip(GEMMA4, case, vllm_results[name]), case.vllm_differs)


def test_vllm_keeps_the_special_tokens(vllm_results) -> None:
    """The composed parser asks the detokenizer for the special tokens (they are its markers)."""
    assert all(r["skip_special_tokens"] is False for r in vllm_results.values())


def test_ids_of_the_rebuilt_text(detector) -> None:
    for name, case in CASES.items():
        if not case.sglang_differs:
            rebuilt = sglang_round_trip(GEMMA4, case, detector)
            assert same_ids(SPECIAL, case.text, rebuilt), name


def test_the_argument_syntax() -> None:
    args = '{"b": "x", "a": [1, 2.5, true, null, {"z": "q", "y": false}], "c": {}}'
    assert arguments_text(args) == f"b:{Q}x{Q},a:[1,2.5,true,null,{{z:{Q}q{Q},y:false}}],c:{{}}"
    assert value_text("") == f"{Q}{Q}"
    assert arguments_text("{}") == ""
    assert arguments_text("not json") == "not json"  # the template writes string arguments as is
    call = ToolCall("c0", "f", '{"k": "v", "n": 2}')
    assert GEMMA4.tool_calls_text([call]) == f"<|tool_call>call:f{{k:{Q}v{Q},n:2}}<tool_call|>"


# -- the prompt ---------------------------------------------------------------------------------
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Oslo?"},
]
CALLED = [
    *CONVERSATION,
    {"role": "assistant", "content": "", "tool_calls": [ToolCall("c0", "get_weather",
                                                                 '{"city": "Oslo"}').to_openai()]},
    {"role": "tool", "tool_call_id": "c0", "content": "sunny"},
]  # fmt: skip


@pytest.mark.parametrize(
    ("thinking", "messages", "engine", "tail", "state"),
    [
        (False, CONVERSATION, "plain", "<|turn>model\n<|channel>thought\n<channel|>", "closed"),
        (True, CONVERSATION, "plain", "<|turn>model\n", "none"),
        # after tool results the template adds no generation prompt: the model continues its turn
        (False, CALLED, "sglang", "<tool_response|>", "none"),
        (True, CALLED, "sglang", "<tool_response|>", "none"),
        # vLLM hands the template the call's empty content as one empty text part, which the
        # template takes for content: it closes the turn, and still adds no generation prompt
        (False, CALLED, "vllm", "<tool_response|><turn|>\n", "none"),
    ],
)
def test_the_think_state_of_the_official_templates_prompts(
    tmp_path, thinking: bool, messages: list, engine: str, tail: str, state: str
) -> None:
    path = family_tokenizer(GEMMA4, tmp_path)
    renderer = Renderer(load_tokenizer(path), GEMMA4.template_kwargs(thinking), GEMMA4)
    prompt = renderer.render_prompt(messages, [TYPED[0]], engine)
    assert prompt.endswith(tail)
    assert ("<|think|>" in prompt) is thinking
    assert GEMMA4.think_state(prompt) == state


def test_the_switch_the_ends_and_the_states() -> None:
    assert GEMMA4.template_kwargs(True) == {"enable_thinking": True}
    assert GEMMA4.template_kwargs(False) == {"enable_thinking": False}
    assert GEMMA4.request_fields(True) == {"skip_special_tokens": False}
    assert GEMMA4.end_tokens() == ("<turn|>", "<|tool_response>", "<eos>")
    assert GEMMA4.think_state("<|turn>model\n<|channel>thought\n") == "open"
    assert GEMMA4.think_state("<|turn>model\n<|channel>") == "open"
    assert GEMMA4.aux_shift == "always"
    assert GEMMA4.sglang_flags() == ["--tool-call-parser", "gemma4", "--reasoning-parser",
                                     "gemma4"]  # fmt: skip
    assert GEMMA4.vllm_flags() == ["--enable-auto-tool-choice", "--tool-call-parser", "gemma4",
                                   "--reasoning-parser", "gemma4"]  # fmt: skip
    with pytest.raises(Exception, match="thought channel"):
        GEMMA4.response_text("closed", "R", "C")


# -- recognition --------------------------------------------------------------------------------
GEMMA4_FACTS = TokenizerFacts(
    chat_template="{{- '<|turn>model\\n' -}}{{- '<|channel>thought\\n<channel|>' -}}",
    tokens=frozenset((*PUBLISHED_IDS, "<|image|>", "<|audio|>", "<|video|>")),
    model_type="gemma4",
)
#: Gemma 3 (and FunctionGemma, built on it): <start_of_turn> framing, no Gemma 4 tokens
GEMMA3_TOKENS = ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>",
                 "<start_function_call>", "<end_function_call>")  # fmt: skip
GEMMA3_FACTS = TokenizerFacts(
    chat_template="{{ '<start_of_turn>model\\n' }}",
    tokens=frozenset(GEMMA3_TOKENS),
    model_type="gemma3",
)


def facts_of(family) -> TokenizerFacts:
    tokens = frozenset((*family.special_tokens, *(family.think or ()), *family.published_ids))
    return TokenizerFacts("", tokens, family.model_types[0] if family.model_types else None)


def test_recognition() -> None:
    assert GEMMA4.recognises(GEMMA4_FACTS)
    assert not GEMMA4.recognises(GEMMA3_FACTS)
    assert not any(f.recognises(GEMMA4_FACTS) for f in FAMILIES.values() if f.name != "gemma4")
    for other in FAMILIES.values():
        if other.name != "gemma4":
            assert not GEMMA4.recognises(facts_of(other)), other.name


def test_recognition_of_a_tokenizer_folder(tmp_path) -> None:
    path = family_tokenizer(GEMMA4, tmp_path)
    (path / "config.json").write_text('{"model_type": "gemma4"}', encoding="utf-8")
    facts = read_facts(str(path))
    assert set(SPECIAL_TOKENS) <= facts.tokens
    assert GEMMA4.recognises(facts)
