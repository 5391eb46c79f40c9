"""Mistral's ``[TOOL_CALLS]`` / ``[THINK]`` (v13) text round trip through both engines' own
parsers: the text the model writes after ``[/INST]`` → SGLang 0.5.23 (``mistral`` reasoning, not
forced: regen sends no ``reasoning_effort``; then the ``mistral`` detector) or vLLM 0.32 (the
parser its chat serving composes from ``mistral`` / ``mistral``, over an HF tokenizer holding
``[ARGS]`` and ``[THINK]``: ``--tokenizer-mode hf``) → (reasoning, content, calls) →
``MISTRAL.response_text`` → the same text, and the same ids through a tokenizer holding the
family's special tokens; where an engine loses something the case names it. Also: the prompts
of the vendored Ministral-3 template (no generation prompt: state ``none``; its strictness),
the serving flags and fields, recognition against the other Mistral formats and families.
"""

from __future__ import annotations

import json

import pytest
from _engines import (
    Case,
    check,
    rebuild,
    same_ids,
    sglang,
    sglang_tools,
    strip_end,
    vllm_parse,
    vllm_round_trip,
)
from _families import family_tokenizer

from regen.core.errors import TemplateError
from regen.core.sample import ToolCall
from regen.targets import FAMILIES, read_facts
from regen.targets.family import TokenizerFacts
from regen.targets.mistral import MISTRAL, PUBLISHED_IDS, SPECIAL_TOKENS
from regen.template.render import Renderer
from regen.template.tokenizer import load_tokenizer

E = "</s>"
W = '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}'
T = '[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}'
THINK = "[THINK]The user asks the weather.[/THINK]"
STRIPPED = "both engines strip the content before a call"
CASES = {
    "reasoning and answer": Case(f"{THINK}It is sunny.{E}"),
    "answer without reasoning": Case(f"It is sunny.{E}"),
    "one call": Case(f"{THINK}{W}{E}", calls=1),
    "two calls": Case(f"{THINK}{W}{T}{E}", calls=2),
    "content before a call": Case(f"{THINK}Let me check.{W}{E}", calls=1),
    "a call without reasoning": Case(f"{W}{E}", calls=1),
    "cut in the reasoning": Case("[THINK]The user asks", finish="length"),
    "cut in the answer": Case(f"{THINK}It is su", finish="length"),
    "compact JSON arguments": Case(
        f'[TOOL_CALLS]get_weather[ARGS]{{"city":"Oslo"}}{E}', calls=1,
        sglang_differs="SGLang re-dumps the arguments with json.dumps (', ', ': ')",
    ),  # vLLM returns the model's JSON text
    "reasoning ending in a newline": Case(
        f"[THINK]The user asks.\n[/THINK]It is sunny.{E}",
        vllm_differs="vLLM strips the reasoning's trailing whitespace",
    ),
    "a space before a call": Case(
        f"{THINK}Let me check. {W}{E}", calls=1, sglang_differs=STRIPPED, vllm_differs=STRIPPED
    ),
    "text after the calls": Case(
        f"{W} Done.{E}", calls=1,
        sglang_differs="SGLang appends the text after the calls to the content",
        vllm_differs="vLLM drops the text after the calls",
    ),
    "a v11 call with a call id (not this family)": Case(
        f'[TOOL_CALLS]get_weather[CALL_ID]abc123XYZ[ARGS]{{"city": "Oslo"}}{E}', calls=1,
        sglang_differs="SGLang drops a call whose name holds [CALL_ID], and its text",
        vllm_differs="vLLM drops the special [CALL_ID]: the call is named get_weatherabc123XYZ",
    ),
    "a v3/v7 JSON list (not this family)": Case(
        f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {{"city": "Oslo"}}}}]{E}', calls=1,
        sglang_differs="SGLang parses the list: the call is rebuilt in the v13 form",
        vllm_differs="with [ARGS] in the vocabulary vLLM reads the list as a call named '['",
    ),
}  # fmt: skip
SPECIAL = [*PUBLISHED_IDS, "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]"]


@pytest.fixture(scope="module")
def detector():
    return sglang("function_call.mistral_detector").MistralDetector()


def sglang_round_trip(case: Case, detector) -> str:
    """The case through serving_chat's non-streamed path, rebuilt: the reasoning parser (not
    forced), then the tool detector as ``FunctionCallParser.parse_non_stream`` drives it
    (function_call_parser.py: text holding the call marker becomes the detector's content,
    even when it parsed no call; that module imports detectors this environment cannot)."""
    reasoning, content = (
        sglang("parser.reasoning_parser")
        .ReasoningParser("mistral", stream_reasoning=False, force_reasoning=False)
        .parse_non_stream(strip_end(MISTRAL, case.text))
    )
    calls: list[ToolCall] = []
    if detector.has_tool_call(content or ""):
        found = detector.detect_and_parse(content, sglang_tools())
        content = found.normal_text
        calls = [ToolCall(f"call_{i}", c.name, c.parameters) for i, c in enumerate(found.calls)]
    assert len(calls) == case.calls or case.sglang_differs, (reasoning, content, calls)
    return rebuild(MISTRAL, case, reasoning or None, content, calls)


@pytest.mark.parametrize("name", list(CASES))
def test_sglang_round_trip(detector, name: str) -> None:
    case = CASES[name]
    check(case, sglang_round_trip(case, detector), case.sglang_differs)


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, dict]:
    results = vllm_parse(MISTRAL, list(CASES.values()), SPECIAL, composed=True)
    return dict(zip(CASES, results, strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_round_trip(vllm_results, name: str) -> None:
    case = CASES[name]
    check(case, vllm_round_trip(MISTRAL, case, vllm_results[name]), case.vllm_differs)


def test_vllm_keeps_the_special_tokens(vllm_results) -> None:
    """With an HF tokenizer the composed parser asks the detokenizer for the special tokens."""
    assert all(r["skip_special_tokens"] is False for r in vllm_results.values())


def test_ids_of_the_rebuilt_text(detector) -> None:
    for name, case in CASES.items():
        if not case.sglang_differs:
            rebuilt = sglang_round_trip(case, detector)
            assert same_ids(SPECIAL, case.text, rebuilt), name


def test_the_calls_are_written_as_given() -> None:
    calls = [ToolCall("a", "f", '{"k":"v"}'), ToolCall("b", "g", '{"n": 2}')]
    written = MISTRAL.tool_calls_text(calls)
    assert written == '[TOOL_CALLS]f[ARGS]{"k":"v"}[TOOL_CALLS]g[ARGS]{"n": 2}'
    assert MISTRAL.response_text("none", "", "Hi") == f"Hi{E}"  # SGLang's empty reasoning: none


def test_serving() -> None:
    assert MISTRAL.template_kwargs(True) == {} == MISTRAL.template_kwargs(False)
    assert MISTRAL.request_fields(True) == {"skip_special_tokens": False}
    assert MISTRAL.vllm_tokenizer_mode == "hf"
    assert MISTRAL.vllm_flags() == [
        "--enable-auto-tool-choice", "--tool-call-parser", "mistral", "--reasoning-parser",
        "mistral", "--tokenizer-mode", "hf",
    ]  # fmt: skip
    assert MISTRAL.sglang_flags() == ["--tool-call-parser", "mistral", "--reasoning-parser",
                                      "mistral"]  # fmt: skip
    assert MISTRAL.end_tokens() == ("</s>",)
    assert MISTRAL.aux_shift == "always"


# -- the prompt ---------------------------------------------------------------------------------
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
ASKED = [{"role": "user", "content": "Weather in Oslo?"}]
CALLED = [
    {"role": "system", "content": "You are terse."},
    *ASKED,
    {"role": "assistant", "content": "", "tool_calls": [ToolCall("c0", "get_weather",
                                                                 '{"city": "Oslo"}').to_openai()]},
    {"role": "tool", "tool_call_id": "c0", "content": "sunny"},
]  # fmt: skip


@pytest.fixture(scope="module")
def renderer(tmp_path_factory) -> Renderer:
    path = family_tokenizer(MISTRAL, tmp_path_factory.mktemp("mistral"))
    return Renderer(load_tokenizer(path), MISTRAL.template_kwargs(True), MISTRAL)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "plain"])
def test_the_prompts_have_no_generation_prompt(renderer: Renderer, engine: str) -> None:
    asked = renderer.render_prompt(ASKED, [TOOL], engine)
    assert asked.endswith("[INST]Weather in Oslo?[/INST]")
    assert "[SYSTEM_PROMPT]# HOW YOU SHOULD THINK AND ANSWER" in asked  # the default: think
    called = renderer.render_prompt(CALLED, [TOOL], engine)
    assert called.endswith(f'[TOOL_CALLS]get_weather[ARGS]{{"city": "Oslo"}}{E}'
                           "[TOOL_RESULTS]sunny[/TOOL_RESULTS]")  # fmt: skip
    assert "HOW YOU SHOULD THINK" not in called  # a caller's system message replaces it
    assert MISTRAL.think_state(asked) == MISTRAL.think_state(called) == "none"


def test_the_template_refuses_turns_that_do_not_alternate(renderer: Renderer) -> None:
    with pytest.raises(TemplateError, match="must alternate"):
        renderer.render_prompt([*ASKED, {"role": "user", "content": "Now?"}], None, "plain")


# -- recognition --------------------------------------------------------------------------------
#: tekken control tokens every v13 tokenizer names (0-19, then [ARGS], [CALL_ID], [THINK], ...)
TEKKEN = frozenset((
    *PUBLISHED_IDS, "[IMG]", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]",
    "[TOOL_CONTENT]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]",
))  # fmt: skip
MINISTRAL3 = '{{- "[TOOL_CALLS]" }}{{- name + "[ARGS]" + arguments }}{{- "[THINK]" }}'
DEVSTRAL = '{{- "[TOOL_CALLS]" + tool["function"]["name"] + "[ARGS]" + arguments }}'
SMALL32 = "{{- '[TOOL_CALLS]' + name }}{{- '[CALL_ID]' + tool_call.id }}{{- '[ARGS]' + args }}"
NEMO = '{{- "[TOOL_CALLS][" }}{%- for tool_call in message.tool_calls %}'


def test_recognition() -> None:
    assert MISTRAL.recognises(TokenizerFacts(MINISTRAL3, TEKKEN, "mistral3"))
    assert MISTRAL.recognises(TokenizerFacts(DEVSTRAL, TEKKEN, "mistral"))
    assert MISTRAL.recognises(TokenizerFacts("", TEKKEN, "ministral3"))
    assert MISTRAL.recognises(TokenizerFacts(MINISTRAL3, TEKKEN, None))
    # v11 (Mistral-Small-3.2) and v3/v7 (Nemo) write other calls
    assert not MISTRAL.recognises(TokenizerFacts(SMALL32, TEKKEN, "mistral3"))
    assert not MISTRAL.recognises(TokenizerFacts(NEMO, TEKKEN - {"[ARGS]"}, "mistral"))
    # the same template on another architecture (Mistral Large 3 is a DeepSeek-V3 model)
    assert not MISTRAL.recognises(TokenizerFacts(MINISTRAL3, TEKKEN, "deepseek_v3"))
    ours = TokenizerFacts(MINISTRAL3, TEKKEN, "mistral3")
    assert [f.name for f in FAMILIES.values() if f.recognises(ours)] == ["mistral"]
    for other in (f for f in FAMILIES.values() if f is not MISTRAL):
        tokens = frozenset((*other.special_tokens, *(other.think or ()), *other.published_ids))
        facts = TokenizerFacts("", tokens, other.model_types[0] if other.model_types else None)
        assert not MISTRAL.recognises(facts), other.name


def test_recognition_of_a_tokenizer_folder(tmp_path) -> None:
    path = family_tokenizer(MISTRAL, tmp_path)
    (path / "config.json").write_text(json.dumps({"model_type": "mistral3"}), encoding="utf-8")
    facts = read_facts(str(path))
    assert set(SPECIAL_TOKENS) <= facts.tokens
    assert MISTRAL.recognises(facts)
