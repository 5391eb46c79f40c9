"""Llama 3's text round trip through both engines' own parsers: the text the model writes after
the assistant header → SGLang 0.5.23 (``llama3`` tools) or vLLM 0.32 (``llama3_json`` tools)
→ (content, calls) → ``LLAMA3.response_text`` → the same text, and the same ids through a
tokenizer holding Llama's special tokens. Llama does not reason: no thinking on or off."""

from __future__ import annotations

import pytest
from _engines import Case, check, same_ids, sglang, sglang_round_trip, vllm_parse, vllm_round_trip

from regen.targets.llama import LLAMA3, PUBLISHED_IDS

EOT = "<|eot_id|>"
W = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
T = '{"name": "get_time", "parameters": {"zone": "CET"}}'
CASES = {
    "an answer": Case(f"It is sunny.{EOT}"),
    "a multi-line answer": Case(f"Line one.\n\nLine two.{EOT}"),
    "one call": Case(f"{W}{EOT}", calls=1),
    "two calls": Case(f"{W}; {T}{EOT}", calls=2),
    "cut in the answer": Case("It is su", finish="length"),
    "content before a call": Case(
        f"Let me check. {W}{EOT}", calls=1,
        # SGLang finds calls only in an answer that starts with "{": the call stays text
        sglang_differs="",
        # vLLM finds the call anywhere and returns no content: the prose is gone
        vllm_differs="vLLM drops the content around a call",
    ),
    "prose with braces": Case(
        f'Use {{"a": 1}} as input.{EOT}',
        # vLLM tries json on every "{": an object without "name" is a KeyError and the whole
        # output comes back as content (no calls), so both give the text back
    ),
}  # fmt: skip
#: SGLang's call counts where they differ from the case's
SGLANG_CALLS = {"content before a call": 0}
SPECIAL = list(PUBLISHED_IDS)


@pytest.fixture(scope="module")
def detector():
    return sglang("function_call.llama32_detector").Llama32Detector()


@pytest.mark.parametrize("name", list(CASES))
def test_sglang_round_trip(detector, name: str) -> None:
    case = CASES[name]
    if name in SGLANG_CALLS:
        case = Case(case.text, calls=SGLANG_CALLS[name])
    check(case, sglang_round_trip(LLAMA3, case, detector), case.sglang_differs)


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, dict]:
    return dict(zip(CASES, vllm_parse(LLAMA3, list(CASES.values()), SPECIAL), strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_round_trip(vllm_results, name: str) -> None:
    case = CASES[name]
    check(case, vllm_round_trip(LLAMA3, case, vllm_results[name]), case.vllm_differs)


def test_ids_of_the_rebuilt_text(detector) -> None:
    for name, case in CASES.items():
        if not case.sglang_differs and name not in SGLANG_CALLS:
            rebuilt = sglang_round_trip(LLAMA3, case, detector)
            assert same_ids(SPECIAL, case.text, rebuilt), name
