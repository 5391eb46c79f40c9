"""The pinned wheel is the one installed, and its files load without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import _sglang

HERE = Path(__file__).resolve().parent


def test_the_installed_sglang_is_the_pinned_version(protocol) -> None:
    assert _sglang.check_version() == _sglang.SGLANG_VERSION == "0.5.23"
    assert protocol.__file__ is not None and "site-packages" in protocol.__file__


def test_its_protocol_and_kimi_parsers_load_on_cpu(reasoning_parser, kimik2_detector) -> None:
    detectors = reasoning_parser.ReasoningParser.DetectorMap
    assert detectors["kimi_k2"] is reasoning_parser.KimiK2Detector
    assert kimik2_detector.KimiK2Detector().bot_token == "<|tool_calls_section_begin|>"
    # in a fresh interpreter: nothing heavy comes along (the package __init__ never runs)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import _sglang\n"
        "for m in ('sglang.srt.entrypoints.openai.protocol', 'sglang.srt.parser.reasoning_parser',"
        " 'sglang.srt.function_call.kimik2_detector'): _sglang.load(m)\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'flashinfer')]\n"
        "assert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(HERE)], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
