"""GLM-4.5's text round trip through both engines' own parsers: the text the model writes after
``<|assistant|>`` → SGLang 0.5.23 (``glm45`` reasoning and tools) or vLLM 0.32 (``glm45``
reasoning and tools) → (reasoning, content, calls) → ``GLM45.response_text`` → the same text,
and the same ids through a tokenizer holding GLM's special tokens."""

from __future__ import annotations

import pytest
from _engines import Case, check, same_ids, sglang, sglang_round_trip, vllm_parse, vllm_round_trip

from regen.targets.glm import GLM45, SPECIAL_TOKENS

ON, OFF = {"enable_thinking": True}, {"enable_thinking": False}
U, OBS = "<|user|>", "<|observation|>"
W = "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>"
T = "\n<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>CET</arg_value>\n</tool_call>"
THINK = "\n<think>The user asks the weather.</think>"
CASES = {
    "reasoning and answer": Case(f"{THINK}\nIt is sunny.{U}", kwargs=ON),
    "thinking off": Case(f"\nIt is sunny.{U}", "closed", kwargs=OFF),
    "one call": Case(f"{THINK}{W}{OBS}", calls=1, kwargs=ON),
    "two calls": Case(f"{THINK}{W}{T}{OBS}", calls=2, kwargs=ON),
    "content before a call": Case(f"{THINK}\nLet me check.{W}{OBS}", calls=1, kwargs=ON),
    "a call, thinking off": Case(f"\nChecking.{W}{OBS}", "closed", calls=1, kwargs=OFF),
    "cut in the reasoning": Case("\n<think>The user asks", finish="length", kwargs=ON),
    "cut in the answer": Case(f"{THINK}\nIt is su", finish="length", kwargs=ON),
}  # fmt: skip
SPECIAL = [*SPECIAL_TOKENS, "<think>", "</think>", "<|endoftext|>"]


@pytest.fixture(scope="module")
def detector():
    return sglang("function_call.glm4_moe_detector").Glm4MoeDetector()


@pytest.mark.parametrize("name", list(CASES))
def test_sglang_round_trip(detector, name: str) -> None:
    case = CASES[name]
    check(case, sglang_round_trip(GLM45, case, detector), case.sglang_differs)


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, dict]:
    return dict(zip(CASES, vllm_parse(GLM45, list(CASES.values()), SPECIAL), strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_round_trip(vllm_results, name: str) -> None:
    case = CASES[name]
    check(case, vllm_round_trip(GLM45, case, vllm_results[name]), case.vllm_differs)


def test_ids_of_the_rebuilt_text(detector) -> None:
    for name, case in CASES.items():
        if not case.sglang_differs:
            rebuilt = sglang_round_trip(GLM45, case, detector)
            assert same_ids(SPECIAL, case.text, rebuilt), name
