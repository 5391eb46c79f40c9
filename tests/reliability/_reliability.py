"""Shared helpers of the reliability tests: the benchmarks' chaos/node-loss code, importable.

benchmarks/chaos.py holds the synthetic source, the manifest, the Ray node launcher, the
kill loop and the verification; the CI-sized tests run exactly that code.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "benchmarks") not in sys.path:
    sys.path.insert(0, str(REPO / "benchmarks"))

import chaos  # noqa: E402
import node_loss  # noqa: E402
import overload  # noqa: E402

__all__ = ["REPO", "chaos", "node_loss", "overload"]
