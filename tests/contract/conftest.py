"""Fixtures of the SGLang contract tests: SGLang 0.5.23's own modules, loaded on CPU."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _sglang


@pytest.fixture(scope="session")
def protocol() -> ModuleType:
    """``sglang/srt/entrypoints/openai/protocol.py`` (ChatCompletionRequest, responses, ...)."""
    return _sglang.load("sglang.srt.entrypoints.openai.protocol")


@pytest.fixture(scope="session")
def sse_utils() -> ModuleType:
    """``sglang/srt/entrypoints/openai/sse_utils.py`` (``build_sse_content``: how SGLang
    serializes content, reasoning and finish chunks)."""
    return _sglang.load("sglang.srt.entrypoints.openai.sse_utils")


@pytest.fixture(scope="session")
def reasoning_parser() -> ModuleType:
    """``sglang/srt/parser/reasoning_parser.py`` (ReasoningParser, KimiK2Detector)."""
    return _sglang.load("sglang.srt.parser.reasoning_parser")


@pytest.fixture(scope="session")
def kimik2_detector() -> ModuleType:
    """``sglang/srt/function_call/kimik2_detector.py`` (the kimi_k2 tool-call parser)."""
    return _sglang.load("sglang.srt.function_call.kimik2_detector")
