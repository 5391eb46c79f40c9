"""An EAGLE (not EAGLE-3) config on a real vLLM 0.32 gets the "draft not used" verdict.

vLLM refuses to start with SpecForge's EAGLE-3 export under ``"method": "eagle"``
(docs/engines.md), so the EAGLE server here serves what that method loads: an EAGLE-1 draft
(tests/engines/_models.py ``build_eagle1_draft``). The server runs in vLLM's dev mode, the only
way it shows its method; `regen bench` then names the method as well as the acceptance.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _models import build_eagle1_draft

from regen.bench.report import read_report
from regen.cli.main import main as regen_main
from regen.devkit.servers.vllm import VllmServer

pytestmark = pytest.mark.vllm

PROMPTS = [
    {"source": src, "sample_id": f"{src}:{i}", "turn": 0, "tools": None,
     "messages": [{"role": "user", "content": f"{src} question {i}"}]}
    for src in ("chat", "code") for i in range(2)
]  # fmt: skip


@pytest.fixture(scope="module")
def eagle_server(
    vllm_python: Path,
    vllm_server: VllmServer,
    engine_models: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[VllmServer]:
    tmp = tmp_path_factory.mktemp("vllm-eagle")
    draft = build_eagle1_draft(tmp / "eagle1", engine_models["target"])
    spec = {"method": "eagle", "model": str(draft), "num_speculative_tokens": 3}
    srv = VllmServer(vllm_python, engine_models["target"], served_name=vllm_server.served_name,
                     max_num_seqs=2,
                     speculative_config=spec, env={"VLLM_SERVER_DEV_MODE": "1"},
                     log_path=tmp / "vllm.log")  # fmt: skip
    with srv:
        yield srv


def test_an_eagle_server_gets_draft_not_used(vllm_server, eagle_server, tmp_path, capsys) -> None:
    prompts = tmp_path / "holdout.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out = tmp_path / "bench"
    rc = regen_main(["bench", "--baseline", vllm_server.url, "--speculative", eagle_server.url,
                     "--prompts", str(prompts), "--per-source", "2", "--concurrency", "1",
                     "--max-tokens", "16", "--temperature", "0", "--out", str(out)])  # fmt: skip
    assert rc == 0
    report = read_report(out / "bench.json")
    spec = report.servers["speculative"]
    assert spec.engine == "vllm" and spec.algorithm == "eagle"  # dev mode shows the method
    assert spec.trap == "eagle-vs-eagle3"
    assert report.acceptance.method == "metrics"
    assert report.acceptance.overall is not None and report.acceptance.overall <= 1.1
    by_code = {v.code: v.text for v in report.verdicts}
    assert [v.code for v in report.verdicts][:2] == ["eagle-vs-eagle3", "draft-not-used"]
    assert "Is the algorithm EAGLE instead of EAGLE3?" in by_code["draft-not-used"]
    assert '"method": "eagle3"' in by_code["draft-not-used"]  # the fix, in vLLM's spelling
    # verify-server refuses it outright
    assert eagle_server.speculative_config is not None
    draft = eagle_server.speculative_config["model"]
    capsys.readouterr()
    assert regen_main(["verify-server", eagle_server.url, "--draft", draft]) == 2
    assert "[eagle-vs-eagle3]" in " ".join(capsys.readouterr().err.split())
