"""`regen simulate` as a process, and the test helpers that start it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from _sim_common import MODEL

from regen.devkit.simulate.testing import (
    options_to_args,
    running_simulator,
    simulator_in_thread,
    with_tokenizer_class,
)
from regen.template.tokenizer import class_spec, load_tokenizer

pytestmark = pytest.mark.timeout(60)

REGEN = [sys.executable, "-m", "regen", "--log-level", "WARNING", "simulate"]
TOKENIZER = Path(__file__).resolve().parents[3] / "manifests" / "demo" / "tokenizer"


def refused(base: str) -> bool:
    try:
        urllib.request.urlopen(base + "/health", timeout=2)
    except (urllib.error.URLError, ConnectionError):
        return True
    return False


def test_bad_options_exit_2_with_one_clean_line():
    p = subprocess.run(
        [*REGEN, "--fail-rate", "0.8", "--stall-rate", "0.5"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert p.returncode == 2
    assert "error:" in p.stderr and "add up to" in p.stderr and "Traceback" not in p.stderr


def test_port_in_use_is_a_clean_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = subprocess.run(
            [*REGEN, "--port", str(port)], capture_output=True, text=True, timeout=30
        )
    assert p.returncode == 2 and "cannot listen" in p.stderr and "Traceback" not in p.stderr


def test_ready_file_url_and_sigterm(tmp_path: Path):
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [*REGEN, "--port", "0", "--ready-file", str(ready)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        url = ready.read_text().strip()  # what --endpoint takes (issue 31, item 9)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        base = url.removesuffix("/v1")
        assert int(base.rsplit(":", 1)[1]) > 0
        assert not refused(base)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert f"{base}/v1" in out


def test_running_simulator_can_be_killed():
    with running_simulator(instant=True) as sim:
        assert sim.url == f"{sim.base}/v1" and sim.port > 0
        assert sim.stats()["received"] == 0
        sim.kill()
        assert sim.process.poll() is not None
        assert refused(sim.base)


def test_in_thread_simulator_starts_and_stops():
    with simulator_in_thread(instant=True, max_running_requests=5) as sim:
        assert sim.process is None
        assert sim.get("/server_info")["max_running_requests"] == 5
        base = sim.base
    assert refused(base)


def test_options_to_args():
    assert options_to_args(
        {"max_running_requests": 8, "instant": True, "tokenizer": None, "x": False}
    ) == ["--max-running-requests", "8", "--instant"]


@pytest.mark.skipif(not TOKENIZER.is_dir(), reason="manifests/demo/tokenizer not built yet")
def test_the_harness_hands_the_simulator_its_tokenizer_class(tmp_path: Path):
    opts = with_tokenizer_class({"tokenizer": TOKENIZER, "instant": True})
    assert opts["tokenizer_class"] == class_spec(load_tokenizer(TOKENIZER))
    given = {"tokenizer": TOKENIZER, "tokenizer_class": "x:Y"}
    assert with_tokenizer_class(given) is given  # a class the caller chose stays
    missing = {"tokenizer": tmp_path / "none"}
    assert with_tokenizer_class(missing) is missing  # the simulator says what is wrong
    with running_simulator(instant=True, tokenizer=TOKENIZER) as sim:
        assert sim.process is not None
        maps = Path(f"/proc/{sim.process.pid}/maps").read_text()
        assert "libtorch" not in maps  # loaded by its class: no model config, no torch
        body = json.dumps({
            "model": MODEL, "max_tokens": 8, "return_prompt_token_ids": True,
            "messages": [{"role": "user", "content": "hi"}],
        }).encode()  # fmt: skip
        req = urllib.request.Request(
            sim.url + "/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=20) as r:
            choice = json.loads(r.read())["choices"][0]
    tok = load_tokenizer(TOKENIZER)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert choice["prompt_token_ids"] == tok.encode(prompt, add_special_tokens=False)
