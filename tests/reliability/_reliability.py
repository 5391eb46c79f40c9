"""Shared helpers of the reliability tests: the benchmarks' chaos/node-loss code.

benchmarks/chaos.py holds the synthetic source, the manifest, the Ray node launcher, the
kill loop and the verification; the CI-sized tests run exactly that code, imported as the
``benchmarks`` package (pytest puts the repository root on the path: pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import chaos, node_loss, overload

REPO = Path(__file__).resolve().parents[2]

__all__ = ["REPO", "chaos", "node_loss", "overload"]
