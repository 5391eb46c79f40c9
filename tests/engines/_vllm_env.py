"""Where the tests find vLLM's own environment (``scripts/vllm-env``), and why they skip when
it is not there: shared by tests/engines and tests/devkit/loop."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def vllm_venv() -> Path:
    return Path(os.environ.get("REGEN_VLLM_VENV") or REPO / ".venv-vllm")


def vllm_python_or_skip() -> Path:
    """The vLLM environment's Python; skips, naming why, when the install is not there."""
    venv = vllm_venv()
    failed = venv / ".install-failed"
    if failed.exists():
        pytest.skip(f"vLLM install failed: {failed.read_text().strip()} (scripts/vllm-env)")
    py = venv / "bin" / "python"
    if not (venv / ".regen-vllm-stamp").exists() or not py.exists():
        pytest.skip(f"no vLLM environment at {venv}: run scripts/vllm-env (scripts/test does)")
    return py
