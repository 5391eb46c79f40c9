"""`regen demo --loop`'s wrong flags and a missing vLLM environment: one line, exit 2, before
anything is built or started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("extra", "expect"),
    [
        (["--rounds", "0"], "--rounds must be >= 1"),
        (["--train-steps", "0"], "--train-steps must be >= 1"),
        (["--bench-concurrency", "1,16"], "must be <= 8"),
        (["--bench-concurrency", "1,x"], "--bench-concurrency"),
        (["--vllm-venv", "{tmp}/none"], "run `bash scripts/vllm-env` first"),
        (["-o", "sources.nope.limit=3"], "nope"),
    ],
)
def test_bad_loop_flags_are_one_line(tmp_path: Path, extra: list[str], expect: str) -> None:
    args = [a.format(tmp=tmp_path) for a in extra]
    if "--vllm-venv" not in args:  # a stand-in environment: the flags are checked first
        venv = tmp_path / "venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").touch()
        args += ["--vllm-venv", str(venv)]
    out = tmp_path / "loop"
    proc = subprocess.run(
        [sys.executable, "-m", "regen", "demo", "--loop", "--out", str(out), "--cache",
         str(tmp_path / "cache"), *args],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert expect in " ".join(proc.stderr.split()) and "Traceback" not in proc.stderr
    assert not out.exists() and not (tmp_path / "cache").exists()  # nothing built or started
