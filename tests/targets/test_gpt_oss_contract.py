"""GPT-OSS's harmony text round trip through both engines' own parsers: the messages the model
writes after ``<|start|>assistant`` → SGLang 0.5.23 (``gpt-oss`` reasoning parser, forced on
for this family, then the ``gpt-oss`` detector) or vLLM 0.32 (``HarmonyParser`` over the ids of
openai_harmony's o200k_harmony encoding) → (reasoning, content, calls) →
``GPT_OSS.response_text`` → the same text; the same ids through a tokenizer holding harmony's
special tokens; harmony's published ids; recognition against every other family.

What each server sees: SGLang's detokenizer trims ``<|return|>`` but keeps ``<|call|>`` for the
``gpt-oss`` tool parser (managers/detokenizer_manager.py ``trim_matched_stop``); vLLM parses
the output ids, which hold the stop token; each case goes to vLLM with and without its end token
and must come back the same.
"""

from __future__ import annotations

import pytest
from _engines import (
    HERE,
    TOOLS,
    VLLM_TIMEOUT_S,
    Case,
    check,
    rebuild,
    same_ids,
    sglang,
    sglang_parse,
    strip_end,
    vllm_calls,
)
from _vllm_call import vllm_call

from regen.targets import FAMILIES
from regen.targets.family import TokenizerFacts
from regen.targets.gpt_oss import (
    ANALYSIS,
    CALL,
    END,
    FINAL,
    GPT_OSS,
    PREAMBLE,
    PUBLISHED_IDS,
    RETURN,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    call_header,
)
from regen.targets.qwen3 import XML_CALL_MARK

A = "<|start|>assistant"
THINK = f"{ANALYSIS}The user asks the weather.{END}"
W = f'{call_header("get_weather")}{{"city": "Oslo"}}{CALL}'
T = f'{call_header("get_time")}{{"zone": "CET"}}{CALL}'
#: the engines re-dump the arguments with json.dumps: compact JSON comes back with spaces
REDUMPED = "both engines return json.dumps of the arguments, with ', ' and ': ' separators"
CASES = {
    "reasoning and answer": Case(f"{THINK}{A}{FINAL}It is sunny.{RETURN}"),
    "answer without reasoning": Case(f"{FINAL}It is sunny.{RETURN}"),
    "one call after reasoning": Case(f"{THINK}{A}{W}", calls=1),
    "a call without reasoning": Case(
        W, calls=1,
        # gpt_oss_detector.has_tool_call needs "<|start|>assistant<|channel|>commentary": a call
        # written as the first message (the prompt wrote its <|start|>assistant) is not seen
        sglang_differs="SGLang returns the call's text as content, with no call",
    ),  # vLLM reads harmony from the ids and needs no such marker
    "a call in the template's order": Case(
        f'{THINK}{A} to=functions.get_weather<|channel|>commentary json<|message|>'
        f'{{"city": "Oslo"}}{CALL}', calls=1,
        # the recipient before the channel: how the template writes earlier turns' calls
        sglang_differs="SGLang's detector needs the channel first: content, no call",
        vllm_differs="vLLM finds the call; it is rebuilt in the model's order",
    ),
    "text before a call": Case(f"{THINK}{A}{PREAMBLE}Let me check.{END}{A}{W}", calls=1),
    # <|call|> stops generation, so a server never returns this; both parsers read it
    "two calls": Case(f"{THINK}{A}{W}{A}{T}", calls=2),
    "compact arguments": Case(
        f'{THINK}{A}{call_header("get_weather")}{{"city":"Oslo"}}{CALL}', calls=1,
        sglang_differs=REDUMPED, vllm_differs=REDUMPED,
    ),
    "cut in the reasoning": Case(f"{ANALYSIS}The user asks", finish="length"),
    "cut in the answer": Case(f"{THINK}{A}{FINAL}It is su", finish="length"),
}  # fmt: skip
SPECIAL = [*SPECIAL_TOKENS, "<|endoftext|>"]


def sglang_sees(text: str) -> str:
    """The text SGLang's parsers get: ``<|return|>`` trimmed, ``<|call|>`` kept."""
    return text.removesuffix(RETURN)


@pytest.fixture(scope="module")
def detector():
    return sglang("function_call.gpt_oss_detector").GptOssDetector()


def sglang_result(case: Case, detector) -> tuple:
    # the gpt-oss reasoning parser is always forced (reasoning_parser.py ReasoningParser)
    return sglang_parse(sglang_sees(case.text), GPT_OSS.sglang.reasoning, detector, force=True)


@pytest.mark.parametrize("name", list(CASES))
def test_sglang_round_trip(detector, name: str) -> None:
    case = CASES[name]
    reasoning, content, calls = sglang_result(case, detector)
    assert len(calls) == case.calls or case.sglang_differs, (reasoning, content, calls)
    check(case, rebuild(GPT_OSS, case, reasoning, content, calls), case.sglang_differs)


def test_sglang_returns_a_first_message_call_as_flagged_content(detector) -> None:
    case = CASES["a call without reasoning"]
    reasoning, content, calls = sglang_result(case, detector)
    assert (reasoning, content, calls) == ("", case.text, [])
    _, _, flag = GPT_OSS.split_response("none", reasoning, content)
    assert flag == "content_has_think"
    assert any(m in content for m in GPT_OSS.call_markers)


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, tuple[dict, dict]]:
    """Per case vLLM's result for the ids with the end token and without it, in one
    call of the vLLM worker; and one more entry: the ids of the special tokens alone."""
    texts = [t for c in CASES.values() for t in (c.text, strip_end(GPT_OSS, c.text))]
    texts.append("".join(PUBLISHED_IDS))
    job = {
        "special": SPECIAL,
        "tools": TOOLS,
        "cases": [{"text": t, "reasoning": GPT_OSS.vllm.reasoning, "tool": GPT_OSS.vllm.tool,
                   "harmony": True} for t in texts],
    }  # fmt: skip
    # the encoding's vocab is built into openai_harmony
    env = {"TIKTOKEN_ENCODINGS_BASE": None}
    out = vllm_call(HERE / "_vllm_parse.py", job, timeout_s=VLLM_TIMEOUT_S, env=env)
    pairs = {name: (out[2 * i], out[2 * i + 1]) for i, name in enumerate(CASES)}
    pairs["<specials>"] = (out[-1], out[-1])
    return pairs


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_round_trip(vllm_results, name: str) -> None:
    case = CASES[name]
    with_end, without_end = vllm_results[name]
    assert "error" not in with_end, with_end
    assert parsed(with_end) == parsed(without_end)
    calls = vllm_calls(with_end)
    assert len(calls) == case.calls, with_end
    rebuilt = rebuild(GPT_OSS, case, with_end["reasoning"], with_end["content"], calls)
    check(case, rebuilt, case.vllm_differs)


def parsed(result: dict) -> dict:
    """A vLLM result without its ids."""
    return {k: v for k, v in result.items() if k != "ids"}


def test_compact_arguments_come_back_spaced(detector, vllm_results) -> None:
    case = CASES["compact arguments"]
    spaced = case.text.replace('{"city":"Oslo"}', '{"city": "Oslo"}')
    assert rebuild(GPT_OSS, case, *sglang_result(case, detector)) == spaced
    got = vllm_results["compact arguments"][0]
    assert rebuild(GPT_OSS, case, got["reasoning"], got["content"], vllm_calls(got)) == spaced


def test_vllm_ids_end_with_harmonys_stop_tokens(vllm_results) -> None:
    for name, case in CASES.items():
        last = vllm_results[name][0]["ids"][-1]
        if case.finish == "stop":
            end = RETURN if case.text.endswith(RETURN) else CALL
            assert case.text.endswith(end) and last == PUBLISHED_IDS[end], name
        else:
            assert last not in (PUBLISHED_IDS[CALL], PUBLISHED_IDS[RETURN]), name


def test_published_ids_are_the_harmony_encodings(vllm_results) -> None:
    assert vllm_results["<specials>"][0]["ids"] == list(PUBLISHED_IDS.values())
    assert VOCAB_SIZE == 201088


def test_ids_of_the_rebuilt_text(detector) -> None:
    for name, case in CASES.items():
        if not case.sglang_differs:
            reasoning, content, calls = sglang_result(case, detector)
            rebuilt = rebuild(GPT_OSS, case, reasoning, content, calls)
            assert same_ids(SPECIAL, case.text, rebuilt), name


def test_a_cut_in_the_reasoning_may_end_on_the_analysis_end() -> None:
    assert GPT_OSS.cut_close() == END
    assert GPT_OSS.think == (ANALYSIS, END)
    assert GPT_OSS.response_text("none", "R", "", (), "length") == f"{ANALYSIS}R"


def test_the_prompt_state_and_the_effort_switch() -> None:
    assert GPT_OSS.think_state("<|start|>user<|message|>hi<|end|><|start|>assistant") == "none"
    assert GPT_OSS.think_state(f"<|start|>assistant{ANALYSIS}") == "open"
    assert GPT_OSS.think_state(f"<|start|>assistant{FINAL}x{END}") == "none"
    assert GPT_OSS.response_text("open", "R", "C") == f"R{END}{A}{FINAL}C{RETURN}"
    assert GPT_OSS.template_kwargs(True) == {"reasoning_effort": "medium"}
    assert GPT_OSS.template_kwargs(False) == {"reasoning_effort": "low"}
    assert GPT_OSS.end_tokens() == (RETURN, CALL)
    assert GPT_OSS.aux_shift == "unless_max_is_layers"


def facts_of(family) -> list[TokenizerFacts]:
    """Hand-built facts of a family's tokenizer, with and without an XML-call template."""
    tokens = frozenset((*family.special_tokens, *(family.think or ()), *family.published_ids))
    model_type = family.model_types[0] if family.model_types else None
    return [TokenizerFacts(t, tokens, model_type) for t in ("", XML_CALL_MARK)]


def test_recognition_picks_gpt_oss_and_no_other_family() -> None:
    ours = TokenizerFacts(
        chat_template="<|start|>assistant<|channel|>final<|message|>",
        tokens=frozenset((*SPECIAL_TOKENS, *PUBLISHED_IDS)),
        model_type="gpt_oss",
    )
    assert [f.name for f in FAMILIES.values() if f.recognises(ours)] == ["gpt_oss"]
    for other in FAMILIES.values():
        if other is not GPT_OSS:
            assert not any(GPT_OSS.recognises(f) for f in facts_of(other)), other.name
