"""The leak check fails what it should (tests/_leaks.py, pyproject.toml's filterwarnings): a
pytest session of its own, under the repository's configuration, runs tests that leave an
aiohttp session, a file, a silenced aiohttp session and a file in a reference cycle open, and
tests that close theirs; each leak fails its test, the closed ones pass."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import asyncio
import gc
import warnings

import aiohttp


async def _session():
    return aiohttp.ClientSession()


def test_session_left_open():
    s = asyncio.run(_session())
    del s


def test_file_left_open(tmp_path):
    f = open(tmp_path / "x", "w")
    del f


def test_session_left_open_with_warnings_silenced():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = asyncio.run(_session())
        del s


def test_session_and_file_closed(tmp_path):
    async def go():
        async with aiohttp.ClientSession():
            pass

    asyncio.run(go())
    with open(tmp_path / "y", "w") as f:
        f.write("closed")


def test_file_in_a_cycle_left_open(tmp_path):
    gc.disable()  # only the collection at the session's end finds it

    class Holder:
        pass

    h = Holder()
    h.me, h.f = h, open(tmp_path / "z", "w")
    del h


def test_last():
    pass
"""


def outcomes(junit: Path) -> dict[str, str]:
    """``{test name: passed | failed | error}`` (a teardown error after a pass: ``error``)."""
    out: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = [c.tag for c in case if c.tag in ("failure", "error")]
        out[case.get("name", "")] = "error" if "error" in kinds else "failed" if kinds else "passed"
    return out


def test_every_leak_fails_its_test_and_closed_things_pass(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(PROBE)
    junit = tmp_path / "junit.xml"
    argv = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
            "-p", "_leaks", "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path),
            f"--junitxml={junit}", str(tmp_path / "test_probe.py")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)])}
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert outcomes(junit) == {
        "test_session_left_open": "failed",  # the unraisable ResourceWarning
        "test_file_left_open": "failed",
        "test_session_left_open_with_warnings_silenced": "error",  # aiohttp's log record
        "test_session_and_file_closed": "passed",
        "test_file_in_a_cycle_left_open": "passed",  # found at the end ...
        "test_last": "error",  # ... in the last test's teardown
    }, run.stdout[-3000:]
    assert "ClientSession" in run.stdout and "Unclosed client session" in run.stdout
