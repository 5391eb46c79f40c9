"""GLM-4.7's text round trip through both engines' own parsers: the text the model writes after
``<|assistant|><think>`` (or ``</think>``) → SGLang 0.5.23 (``glm45`` reasoning, ``glm47``
tools) or vLLM 0.32 (``glm47`` reasoning and tools, the parser its chat serving composes) →
(reasoning, content, calls) → ``GLM47.response_text`` → the same text, and the same ids
through a tokenizer holding GLM's special tokens. Also: SGLang's GLM-4.5 tool parser finds no
GLM-4.7 call (the family's parser choice), and the vendored template's generation prompt leaves
the reasoning open / closed as the family reads it."""

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

from regen.targets import read_facts
from regen.targets.family import TokenizerFacts
from regen.targets.glm import GLM45, SPECIAL_TOKENS
from regen.targets.glm47 import GLM47

ON, OFF = {"enable_thinking": True}, {"enable_thinking": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "opts": {"type": "object"}}}}}  # fmt: skip
TOOLS = [WEATHER, TIME]
U, OBS = "<|user|>", "<|observation|>"
W = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>"
T = "<tool_call>get_time<arg_key>zone</arg_key><arg_value>CET</arg_value></tool_call>"
R = "The user asks the weather.</think>"
CASES = {
    "reasoning and answer": Case(f"{R}It is sunny.{U}", "open", kwargs=ON),
    "thinking off": Case(f"It is sunny.{U}", "closed", kwargs=OFF),
    "one call": Case(f"{R}{W}{OBS}", "open", calls=1, kwargs=ON),
    "two calls": Case(f"{R}{W}{T}{OBS}", "open", calls=2, kwargs=ON),
    "content before a call": Case(f"{R}Let me check.{W}{OBS}", "open", calls=1, kwargs=ON),
    "a call, thinking off": Case(f"Checking.{W}{OBS}", "closed", calls=1, kwargs=OFF),
    "a call without arguments": Case(
        f"{R}<tool_call>get_time</tool_call>{OBS}", "open", calls=1, kwargs=ON),
    "cut in the reasoning": Case("The user asks", "open", finish="length", kwargs=ON),
    "cut in the answer": Case(f"{R}It is su", "open", finish="length", kwargs=ON),
    "ended by <|endoftext|>": Case(f"{R}It is sunny.<|endoftext|>", "open", kwargs=ON,
        sglang_differs="the rebuild ends the answer with the next role token, <|user|>",
        vllm_differs="the rebuild ends the answer with the next role token, <|user|>"),
    "a call in the reasoning": Case(f"Need the weather.{W}{OBS}", "open", calls=1, kwargs=ON,
        sglang_differs="the call ends the reasoning: the rebuild writes the </think> the "
                       "model left out",
        vllm_differs="the call ends the reasoning: the rebuild writes the </think> the model "
                     "left out"),
    "a value written as JSON text": Case(
        f'{R}<tool_call>get_weather<arg_key>city</arg_key><arg_value>"Oslo"</arg_value>'
        f"</tool_call>{OBS}", "open", calls=1, kwargs=ON,
        sglang_differs="a string-typed value written as a JSON string loses its quotes"),
    "typed values": Case(
        f"{R}<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
        f'<arg_key>days</arg_key><arg_value>3</arg_value><arg_key>opts</arg_key><arg_value>'
        f'{{"u": "C", "v": [1, true]}}</arg_value></tool_call>{OBS}', "open", calls=1,
        kwargs=ON),
    "an object value written compactly": Case(
        f'{R}<tool_call>get_weather<arg_key>opts</arg_key><arg_value>{{"u":"C"}}</arg_value>'
        f"</tool_call>{OBS}", "open", calls=1, kwargs=ON,
        sglang_differs="the value is re-serialised with JSON's default separators",
        vllm_differs="the value is re-serialised with JSON's default separators"),
    "text after the call": Case(f"{R}{W}Done.{OBS}", "open", calls=1, kwargs=ON,
        sglang_differs="text after a call is appended to the content, before the call",
        vllm_differs="text after a call is dropped"),
}  # fmt: skip
SPECIAL = [*SPECIAL_TOKENS, "<think>", "</think>", "<|endoftext|>"]
TEMPLATE = Path(__file__).resolve().parents[2] / "regen/devkit/tokenizers/templates/glm47.jinja"


def sglang_round_trip(case: Case) -> str:
    """The case through SGLang's parsers (the reasoning forced open when thinking is on, as the
    template's toggle makes serving_chat do) with :data:`TOOLS`, and back."""
    detector = sglang("function_call.glm47_moe_detector").Glm47MoeDetector()
    reasoning, content, calls = sglang_parse(
        strip_end(GLM47, case.text), GLM47.sglang.reasoning, detector,
        force=case.kwargs.get("enable_thinking", True), tools=TOOLS,
    )  # fmt: skip
    assert len(calls) == case.calls or case.sglang_differs, (reasoning, content, calls)
    return rebuild(GLM47, case, reasoning, content, calls)


@pytest.mark.parametrize("name", list(CASES))
def test_sglang_round_trip(name: str) -> None:
    case = CASES[name]
    check(case, sglang_round_trip(case), case.sglang_differs)


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, dict]:
    found = vllm_parse(GLM47, list(CASES.values()), SPECIAL, composed=True, tools=TOOLS)
    return dict(zip(CASES, found, strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_round_trip(vllm_results, name: str) -> None:
    case = CASES[name]
    check(case, vllm_round_trip(GLM47, case, vllm_results[name]), case.vllm_differs)


def test_ids_of_the_rebuilt_text() -> None:
    for name, case in CASES.items():
        if not case.sglang_differs:
            assert same_ids(SPECIAL, case.text, sglang_round_trip(case)), name


def test_sglang_glm45_tool_parser_loses_glm47_calls() -> None:
    """Why the family names SGLang's ``glm47`` tool parser: ``glm45`` needs a newline after
    the call's name and finds nothing in a GLM-4.7 reply."""
    text = f"Let me check.{W}"
    glm45 = sglang("function_call.glm4_moe_detector").Glm4MoeDetector()
    assert sglang_parse(text, None, glm45)[2] == []
    glm47 = sglang("function_call.glm47_moe_detector").Glm47MoeDetector()
    assert [c.name for c in sglang_parse(text, None, glm47)[2]] == ["get_weather"]


def test_the_rebuild_is_not_glm45s() -> None:
    """GLM-4.5 writes newlines before the content and each call; GLM-4.7 writes none."""
    case = CASES["content before a call"]
    calls = sglang_parse(case.text.removesuffix(OBS), "glm45",
                         sglang("function_call.glm47_moe_detector").Glm47MoeDetector(),
                         force=True)[2]  # fmt: skip
    mine = GLM47.response_text("open", "The user asks the weather.", "Let me check.", calls)
    theirs = GLM45.response_text("open", "The user asks the weather.", "Let me check.", calls)
    assert mine == case.text and "\n" not in mine and theirs != mine


@pytest.mark.parametrize(("kwargs", "state"), [(ON, "open"), (OFF, "closed"), ({}, "open")])
def test_the_template_leaves_the_reasoning_as_the_family_reads_it(kwargs: dict, state: str) -> None:
    """The vendored template's generation prompt is ``<|assistant|><think>`` (thinking on, the
    default) or ``<|assistant|></think>``; ``think_state`` reads it so."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    prompt = env.from_string(TEMPLATE.read_text(encoding="utf-8")).render(
        messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=True, **kwargs
    )
    assert prompt.startswith("[gMASK]<sop><|user|>Hi<|assistant|>")
    assert GLM47.think_state(prompt) == state
    assert GLM47.template_kwargs(False) == OFF and GLM47.template_kwargs(True) == ON


# -- recognition: GLM-4.5 / 4.6 and GLM-4.7 share tokens and model type; the template decides --
GLM_TOKENS = frozenset(
    {*SPECIAL_TOKENS, "<|endoftext|>", "<think>", "</think>", "<tool_response>",
     "</tool_response>", "/nothink", "[MASK]", "[sMASK]", "<eop>"}
)  # fmt: skip
GLM45_TEMPLATE = (TEMPLATE.parent / "glm45.jinja").read_text(encoding="utf-8")
GLM47_TEMPLATE = TEMPLATE.read_text(encoding="utf-8")
#: GLM-5.3's template keeps 4.7's calls but has no thinking switch (SGLang ``_is_glm53``)
GLM53_TEMPLATE = (
    "[gMASK]<sop><|system|>Reasoning Effort: {{ reasoning_effort }}"
    "{{- '<tool_call>' + tc.name -}}<arg_key></arg_key><arg_value></arg_value>"
)


def first(facts: TokenizerFacts) -> str | None:
    """The family the registry finds when it tries GLM-4.7 before GLM-4.5 (the order it must
    register them in while GLM-4.5's recognition reads the tokens only)."""
    return next((f.name for f in (GLM47, GLM45) if f.recognises(facts)), None)


@pytest.mark.parametrize(
    ("template", "model_type", "is_glm47"),
    [
        (GLM47_TEMPLATE, "glm4_moe", True),  # GLM-4.7
        (GLM47_TEMPLATE, "glm4_moe_lite", True),  # GLM-4.7-Flash
        (GLM47_TEMPLATE, None, True),  # a tokenizer folder without config.json
        ("", "glm4_moe_lite", True),  # 4.7-Flash without a template
        (GLM45_TEMPLATE, "glm4_moe", False),  # GLM-4.5 / 4.6
        (GLM45_TEMPLATE, None, False),
        ("", "glm4_moe", False),  # no template: not told apart, GLM-4.5's
        ("", None, False),
        (GLM47_TEMPLATE, "glm_moe_dsa", False),  # GLM-5 (another loader, another aux rule)
        (GLM53_TEMPLATE, None, False),  # GLM-5.3: no thinking switch
    ],
)  # fmt: skip
def test_glm47_is_told_from_glm45_by_its_template(
    template: str, model_type: str | None, is_glm47: bool
) -> None:
    facts = TokenizerFacts(chat_template=template, tokens=GLM_TOKENS, model_type=model_type)
    assert GLM47.recognises(facts) == is_glm47
    if is_glm47:
        assert first(facts) == "glm47"
    elif model_type in (None, "glm4_moe") and "tc.name" not in template:
        assert first(facts) == "glm45"


def test_glm47_needs_glms_tokens() -> None:
    facts = TokenizerFacts(
        chat_template=GLM47_TEMPLATE, tokens=frozenset({"<|im_start|>"}), model_type=None
    )
    assert not GLM47.recognises(facts)


@pytest.mark.parametrize(("template", "found"), [(GLM47_TEMPLATE, "glm47"),
                                                 (GLM45_TEMPLATE, "glm45")])  # fmt: skip
def test_a_tokenizer_folder_is_read_and_recognised(
    tmp_path: Path, template: str, found: str
) -> None:
    """A folder as Hugging Face writes it: the added tokens in ``tokenizer_config.json``, the
    template in ``chat_template.jinja``, ``config.json``'s model type."""
    decoder = {str(151329 + i): {"content": t, "special": True} for i, t in enumerate(GLM_TOKENS)}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    (tmp_path / "chat_template.jinja").write_text(template, encoding="utf-8")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "glm4_moe"}))
    assert first(read_facts(str(tmp_path))) == found
