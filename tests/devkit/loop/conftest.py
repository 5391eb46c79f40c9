"""Fixtures of the loop's tests: vLLM's environment (as tests/engines finds it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engines"))

from _vllm_env import vllm_python_or_skip


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """vLLM's Python for the loop (skips, naming why, when the install is not there)."""
    return vllm_python_or_skip()
