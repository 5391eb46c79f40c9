"""Every attribute the code reads from one of its own modules through an imported name exists
(``L.read_manifest`` after the manifest I/O moved out of regen.store.layout broke the whole
loop, and only the loop's end-to-end test ran that line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).with_name("_module_attrs.py")


def _missing(*roots: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    proc = subprocess.run([sys.executable, str(SCRIPT), *roots], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("roots", [("regen", "monitor", "pipelines", "benchmarks"), ("tests",)])
def test_every_module_attribute_read_through_an_import_exists(roots: tuple[str, ...]) -> None:
    assert _missing(*roots) == []


def test_a_missing_module_attribute_is_found(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from regen.store import layout as L\n\nL.read_manifest\nL.MANIFEST\n")
    assert _missing(str(tmp_path)) == [f"{bad}:3: L.read_manifest (regen.store.layout)"]
