"""Qwen3's text round trip through both engines' own parsers: the text the model writes after
its generation prompt → SGLang 0.5.23 (``qwen3`` reasoning, ``qwen25`` tools) or vLLM 0.32
(``qwen3`` reasoning, ``hermes`` tools) → (reasoning, content, calls) →
``QWEN3.response_text`` → the same text, and the same ids through a tokenizer holding Qwen3's
special tokens."""

from __future__ import annotations

import pytest
from _engines import (
    Case,
    check,
    same_ids,
    sglang,
    sglang_round_trip,
    vllm_parse,
    vllm_round_trip,
)

from regen.targets.qwen3 import PUBLISHED_IDS, QWEN3

ON, OFF = {"enable_thinking": True}, {"enable_thinking": False}
END = "<|im_end|>"
W = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
T = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
THINK = "<think>\nThe user asks the weather.\n</think>\n\n"
CASES = {
    "reasoning and answer": Case(f"{THINK}It is sunny.{END}", kwargs=ON),
    "a multi-line answer": Case(f"{THINK}Line one.\n\nLine two.\n{END}", kwargs=ON),
    "thinking off": Case(f"It is sunny.{END}", state="closed", kwargs=OFF),
    "one call": Case(f"{THINK}{W}{END}", calls=1, kwargs=ON),
    "two calls": Case(f"{THINK}{W}\n{T}{END}", calls=2, kwargs=ON),
    "content before a call": Case(f"{THINK}Let me check.\n{W}{END}", calls=1, kwargs=ON),
    "a call, thinking off": Case(f"Checking.\n{W}{END}", state="closed", calls=1, kwargs=OFF),
    "cut in the reasoning": Case("<think>\nThe user asks", finish="length", kwargs=ON),
    "cut in the answer": Case(f"{THINK}It is su", finish="length", kwargs=ON),
    "a thinking-2507 prompt (open)": Case(
        "The user asks.\n</think>\n\nIt is sunny.<|im_end|>", state="open", kwargs=ON,
        vllm_differs="",
    ),
    "content without the template's newlines": Case(
        f"<think>plan</think>It is sunny.{END}", kwargs=ON,
        sglang_differs="the rebuild writes the template's <think>\\n…\\n</think>\\n\\n",
        vllm_differs="the rebuild writes the template's <think>\\n…\\n</think>\\n\\n",
    ),
}  # fmt: skip
SPECIAL = list(PUBLISHED_IDS)


@pytest.fixture(scope="module")
def detector():
    return sglang("function_call.qwen25_detector").Qwen25Detector()


@pytest.mark.parametrize("name", list(CASES))
def test_sglang_round_trip(detector, name: str) -> None:
    case = CASES[name]
    check(case, sglang_round_trip(QWEN3, case, detector), case.sglang_differs)


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, dict]:
    return dict(zip(CASES, vllm_parse(QWEN3, list(CASES.values()), SPECIAL), strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_round_trip(vllm_results, name: str) -> None:
    case = CASES[name]
    check(case, vllm_round_trip(QWEN3, case, vllm_results[name]), case.vllm_differs)


def test_ids_of_the_rebuilt_text(detector) -> None:
    for name, case in CASES.items():
        if not case.sglang_differs:
            rebuilt = sglang_round_trip(QWEN3, case, detector)
            assert same_ids(SPECIAL, case.text, rebuilt), name
