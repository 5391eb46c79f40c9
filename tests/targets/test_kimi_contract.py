"""Kimi's text round trip through vLLM 0.32's own parsers (``kimi_k2`` reasoning and tools):
the text the model writes after a thinking prompt that opened ``<think>`` → (reasoning,
content, calls) → ``KIMI.response_text`` → the same text. SGLang's side is
tests/contract/test_kimi_parsers.py."""

from __future__ import annotations

import pytest
from _engines import Case, check, vllm_parse

from regen.core.sample import ToolCall
from regen.targets.kimi import (
    CALL_ARGS,
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    KIMI,
    PUBLISHED_IDS,
)

ON, OFF = {"thinking": True}, {"thinking": False}
END = "<|im_end|>"


def call(i: int, name: str, args: str) -> str:
    return f"{CALL_BEGIN}functions.{name}:{i}{CALL_ARGS}{args}{CALL_END}"


W, T = call(0, "get_weather", '{"city": "Oslo"}'), call(1, "get_time", '{"zone": "CET"}')
CASES = {
    "reasoning and answer": Case(f"Two and two.</think>It is 4.{END}", "open", kwargs=ON),
    "thinking off": Case(f"It is 4.{END}", "closed", kwargs=OFF),
    "one call": Case(f"Need it.</think>{CALLS_BEGIN}{W}{CALLS_END}{END}", "open", calls=1,
                     kwargs=ON),
    "two calls": Case(f"Need both.</think>{CALLS_BEGIN}{W}{T}{CALLS_END}{END}", "open",
                      calls=2, kwargs=ON),
    "content before a call": Case(
        f"Need it.</think>Checking.{CALLS_BEGIN}{W}{CALLS_END}{END}", "open", calls=1, kwargs=ON),
    "cut in the reasoning": Case("Two and", "open", finish="length", kwargs=ON),
}  # fmt: skip


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, dict]:
    special = [*PUBLISHED_IDS, "<think>", "</think>"]
    return dict(zip(CASES, vllm_parse(KIMI, list(CASES.values()), special), strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_round_trip(vllm_results, name: str) -> None:
    """vLLM keeps the model's ``functions.NAME:N`` ids; the calls carry them here."""
    case, result = CASES[name], vllm_results[name]
    assert "error" not in result, result
    calls = [ToolCall(f"functions.{n}:{i}", n, a) for i, (n, a) in enumerate(result["calls"])]
    assert len(calls) == case.calls
    rebuilt = KIMI.response_text(case.state, result["reasoning"], result["content"] or "",
                                 calls, case.finish)  # fmt: skip
    check(case, rebuilt, case.vllm_differs)
