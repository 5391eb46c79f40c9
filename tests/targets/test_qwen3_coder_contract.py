"""Qwen3-Coder / Qwen3.5's text round trip through both engines' own parsers: the text the
model writes → SGLang 0.5.23 (``qwen3`` reasoning, ``qwen3_coder`` tools) or vLLM 0.32
(``qwen3`` reasoning, ``qwen3_coder`` tools) → (reasoning, content, calls) →
``QWEN3_CODER.response_text`` → the same text, and the same ids through a tokenizer holding
Qwen's special tokens."""

from __future__ import annotations

import pytest
from _engines import Case, check, same_ids, sglang, sglang_round_trip, vllm_parse, vllm_round_trip

from regen.targets.qwen3 import PUBLISHED_IDS
from regen.targets.qwen3_coder import QWEN3_CODER

ON, OFF = {"enable_thinking": True}, {"enable_thinking": False}
END = "<|im_end|>"


def xml(name: str, key: str, value: str) -> str:
    """One call as Qwen3-Coder writes it."""
    param = f"<parameter={key}>\n{value}\n</parameter>\n"
    return f"<tool_call>\n<function={name}>\n{param}</function>\n</tool_call>"


W, T = xml("get_weather", "city", "Oslo"), xml("get_time", "zone", "CET")
THINK = "The user asks the weather.\n</think>\n\n"  # after Qwen3.5's open prompt <think>\n
CASES = {
    "reasoning and answer": Case(f"{THINK}It is sunny.{END}", "open", kwargs=ON),
    "thinking off": Case(f"It is sunny.{END}", "closed", kwargs=OFF),
    "one call": Case(f"{THINK}{W}{END}", "open", calls=1, kwargs=ON),
    "two calls": Case(f"{THINK}{W}\n{T}{END}", "open", calls=2, kwargs=ON),
    "content before a call": Case(f"{THINK}Let me check.\n\n{W}{END}", "open", calls=1, kwargs=ON),
    "Qwen3-Coder: a call, no reasoning": Case(
        f"Let me check.\n\n{W}{END}", "closed", calls=1, kwargs=OFF
    ),
    "cut in the reasoning": Case("The user asks", "open", finish="length", kwargs=ON),
    "cut in the answer": Case(f"{THINK}It is su", "open", finish="length", kwargs=ON),
    "one newline before the call": Case(
        f"{THINK}Let me check.\n{W}{END}", "open", calls=1, kwargs=ON,
        sglang_differs="the rebuild writes the template's \\n\\n before the first call",
        vllm_differs="the rebuild writes the template's \\n\\n before the first call",
    ),
}  # fmt: skip
SPECIAL = list(PUBLISHED_IDS)


@pytest.fixture(scope="module")
def detector():
    return sglang("function_call.qwen3_coder_detector").Qwen3CoderDetector()


@pytest.mark.parametrize("name", list(CASES))
def test_sglang_round_trip(detector, name: str) -> None:
    case = CASES[name]
    check(case, sglang_round_trip(QWEN3_CODER, case, detector), case.sglang_differs)


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, dict]:
    return dict(zip(CASES, vllm_parse(QWEN3_CODER, list(CASES.values()), SPECIAL), strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_round_trip(vllm_results, name: str) -> None:
    case = CASES[name]
    check(case, vllm_round_trip(QWEN3_CODER, case, vllm_results[name]), case.vllm_differs)


def test_ids_of_the_rebuilt_text(detector) -> None:
    for name, case in CASES.items():
        if not case.sglang_differs:
            rebuilt = sglang_round_trip(QWEN3_CODER, case, detector)
            assert same_ids(SPECIAL, case.text, rebuilt), name
