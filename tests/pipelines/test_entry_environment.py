"""A job run by a Python without regen's dependencies (the head's bare `python`; issue 31,
item 2) says so in one line, exit 2, instead of a traceback ending in "No module named
'rich'"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: this Python with rich made unimportable, then the entrypoint run as `python -m` runs it
WITHOUT_RICH = (
    "import runpy, sys; sys.modules['rich'] = None; sys.argv[0] = '{mod}'; "
    "runpy.run_module('{mod}', run_name='__main__', alter_sys=True)"
)


@pytest.mark.parametrize("mod", ["pipelines.regenerate", "pipelines.train_draft"])
def test_an_entrypoint_without_regens_environment_says_so(mod: str) -> None:
    p = subprocess.run(
        [sys.executable, "-c", WITHOUT_RICH.format(mod=mod), "manifests/demo.yaml", "--out", "/x"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith(f"error: python -m {mod}: {sys.executable} is not regen's")
    assert "No module named 'rich" in lines[0] and "README 'On a cluster'" in lines[0]
