"""serve-command prints the EAGLE3 SGLang command; verify-server checks a real `regen simulate`."""

from __future__ import annotations

import http.server
import itertools
import json
import shlex
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from train_fixtures import PRODUCTION_TRAIN

from regen.cli.main import main as regen_main
from regen.core.errors import TrapError
from regen.devkit.simulate.testing import running_simulator
from regen.serve.sglang import verify_server

DRAFT = "/drafts/kimi-k25-eagle3"
#: answers of the speculative simulators: 400 tokens, cut by SERVED_TOKENS
ANSWERS = {"mean_tokens": 400, "length_sigma": 0}
#: one answer of 211 tokens: the prefill's, then 210 kept by verify steps, so the running
#: acceptance is exactly the configured one (2.1: 2 nine steps in ten, 3 in the tenth)
SERVED_TOKENS = 211


def serve_one(base: str) -> None:
    """One request, so that the simulator's running avg_spec_accept_length is reported (SGLang
    reports none before its first verify step)."""
    body = {"model": "moonshotai/Kimi-K2.5", "max_tokens": SERVED_TOKENS,
            "messages": [{"role": "user", "content": "draft?"}]}  # fmt: skip
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as r:
        assert json.loads(r.read())["usage"]["completion_tokens"] == SERVED_TOKENS


@pytest.fixture(scope="module")
def sim_eagle() -> Iterator[str]:
    with running_simulator(
        instant=True,
        speculative_algorithm="EAGLE",
        speculative_draft_model_path=DRAFT,
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
    ) as sim:
        yield sim.base


@pytest.fixture(scope="module")
def sim_eagle3() -> Iterator[str]:
    with running_simulator(
        instant=True,
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=DRAFT,
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
        spec_accept_length=2.1,
        **ANSWERS,
    ) as sim:
        yield sim.base


def test_verify_server_fails_on_eagle(sim_eagle: str, capsys) -> None:
    assert regen_main(["verify-server", sim_eagle, "--draft", DRAFT]) == 2
    err = capsys.readouterr().err
    assert "[eagle-vs-eagle3]" in err and "'EAGLE'" in err


def test_verify_server_passes_on_eagle3_and_reports_acceptance(sim_eagle3: str, capsys) -> None:
    serve_one(sim_eagle3)
    assert regen_main(["verify-server", sim_eagle3, "--draft", DRAFT + "/"]) == 0
    out = capsys.readouterr().out
    assert "EAGLE3" in out and "avg_spec_accept_length: 2.100" in out
    check = verify_server(sim_eagle3, DRAFT)
    assert (check.num_steps, check.eagle_topk, check.num_draft_tokens) == (3, 1, 4)


def test_verify_server_accepts_the_openai_base_url(sim_eagle3: str, capsys) -> None:
    """--endpoint takes http://host:port/v1; verify-server must take the same string."""
    assert regen_main(["verify-server", sim_eagle3 + "/v1", "--draft", DRAFT]) == 0
    assert verify_server(sim_eagle3 + "/v1/", DRAFT).algorithm == "EAGLE3"
    assert "not helping" not in capsys.readouterr().out


def test_verify_server_warns_when_the_draft_is_not_helping(capsys) -> None:
    with running_simulator(
        instant=True,
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=DRAFT,
        spec_accept_length=1.05,
        **ANSWERS,
    ) as sim:
        assert regen_main(["verify-server", sim.base, "--draft", DRAFT]) == 0
        assert "avg_spec_accept_length: not reported yet" in capsys.readouterr().out
        serve_one(sim.base)  # 210 tokens in 200 verify steps
        assert regen_main(["verify-server", sim.base, "--draft", DRAFT]) == 0  # warn, not fail
        out = capsys.readouterr().out
        assert "avg_spec_accept_length: 1.050" in out and "the draft is not helping" in out
        check = verify_server(sim.base, DRAFT)
    assert check.draft_not_helping


def test_verify_server_fails_on_another_draft(sim_eagle3: str) -> None:
    with pytest.raises(TrapError) as ei:
        verify_server(sim_eagle3, "/drafts/other")
    assert ei.value.trap == "wrong-draft"


class _OldServer(http.server.BaseHTTPRequestHandler):
    """Only the old alias /get_server_info exists."""

    def do_GET(self) -> None:
        if self.path != "/get_server_info":
            self.send_error(404)
            return
        body = json.dumps(
            {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": DRAFT}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_verify_server_falls_back_to_get_server_info() -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OldServer)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        check = verify_server(f"http://127.0.0.1:{srv.server_address[1]}", DRAFT, timeout=5)
        assert check.algorithm == "EAGLE3" and check.avg_accept_length is None
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=5)


def _printed_argv(capsys) -> list[str]:
    return shlex.split(capsys.readouterr().out.strip())


def test_serve_command_prints_eagle3_with_all_tuning_and_kimi_flags(tmp_path, capsys) -> None:
    draft = tmp_path / "kimi-k25-eagle3"
    draft.mkdir()
    assert regen_main(["serve-command", str(draft), "--target", "/models/Kimi-K2.5",
                       "--family", "kimi", "--engine", "sglang"]) == 0  # fmt: skip
    argv = _printed_argv(capsys)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    pairs = dict(itertools.pairwise(argv))
    assert pairs["--speculative-algorithm"] == "EAGLE3"
    assert pairs["--speculative-draft-model-path"] == str(draft)
    assert pairs["--speculative-num-steps"] == "3"
    assert pairs["--speculative-eagle-topk"] == "1"
    assert pairs["--speculative-num-draft-tokens"] == "4"
    assert pairs["--tp"] == "8" and pairs["--model-path"] == "/models/Kimi-K2.5"
    assert pairs["--tool-call-parser"] == "kimi_k2" and pairs["--reasoning-parser"] == "kimi_k2"
    assert "--trust-remote-code" in argv


@pytest.mark.parametrize("engine", ["all", "sglang", "vllm"])
def test_serve_command_refuses_a_draft_that_does_not_exist(tmp_path, capsys, engine) -> None:
    """Issue 31, item 8: no command for a draft that is not there; one line, exit 2."""
    draft = tmp_path / "no-such-draft"
    code = regen_main(["serve-command", str(draft), "--target", "/models/Kimi-K2.5",
                       "--family", "kimi", "--engine", engine])  # fmt: skip
    out = capsys.readouterr()
    assert code == 2 and out.out == ""
    assert out.err == (f"error: DRAFT_DIR {draft} does not exist: give the trained draft's "
                       "checkpoint directory (regen train writes it; run serve-command where "
                       "it is)\n")  # fmt: skip


def test_serve_command_from_config_refuses_a_draft_with_sglang_numbered_ids(
    tmp_path: Path, capsys
) -> None:
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(
        json.dumps(
            {"hidden_size": 7168, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}}
        )
    )
    assert regen_main(["serve-command", str(draft), "--config", str(PRODUCTION_TRAIN)]) == 2
    assert "[aux-layer-numbering]" in capsys.readouterr().err


def test_verify_server_passes_against_a_keyed_server_and_never_shows_the_key(
    tmp_path: Path, monkeypatch, capsys, caplog
) -> None:
    key = "sk-sim-7f3a9c"
    key_file = tmp_path / "sglang.key"
    key_file.write_text(key + "\n")
    monkeypatch.setenv("REGEN_VERIFY_KEY", key)
    with running_simulator(
        instant=True,
        api_key=key,
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=DRAFT,
        spec_accept_length=2.1,
    ) as sim:
        caplog.set_level("DEBUG")
        # no key: refused, and the message says what is missing
        assert regen_main(["verify-server", sim.base, "--draft", DRAFT]) == 2
        assert "wants an API key and regen sent no key" in capsys.readouterr().err
        for flags in (["--api-key-env", "REGEN_VERIFY_KEY"], ["--api-key-file", str(key_file)]):
            assert regen_main(["verify-server", sim.base, "--draft", DRAFT, *flags]) == 0
            out = capsys.readouterr()
            assert "EAGLE3" in out.out and key not in out.out + out.err
        # a wrong key: refused without echoing either key
        (tmp_path / "wrong.key").write_text("not-the-key")
        assert regen_main(["verify-server", sim.base, "--draft", DRAFT, "--api-key-file",
                           str(tmp_path / "wrong.key")]) == 2  # fmt: skip
        out = capsys.readouterr()
        assert "a wrong key" in out.err and "not-the-key" not in out.out + out.err
    assert key not in caplog.text
