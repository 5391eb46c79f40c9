"""Speculation on a real vLLM 0.32: `regen serve-command --engine vllm`, `regen verify-server`
and `regen bench` against a server speculating with an untrained EAGLE-3 draft built with
SpecForge's own draft class (the wiring, not a trained draft: no speedup is asserted, and the
draft's acceptance is the floor, which is what the "draft not used" verdict is for).
"""

from __future__ import annotations

import itertools
import json
import shlex
from pathlib import Path

import pytest

from regen.bench.report import read_report
from regen.cli.main import main as regen_main

pytestmark = pytest.mark.vllm

PROMPTS = [
    {"source": src, "sample_id": f"{src}:{i}", "turn": 0, "tools": None,
     "messages": [{"role": "user", "content": f"{src} question {i}"}]}
    for src in ("chat", "code") for i in range(2)
]  # fmt: skip


def test_serve_command_writes_the_vllm_copy_and_prints_both(tmp_path, capsys) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _models import build_eagle3_draft, build_scripted_target

    target = build_scripted_target(tmp_path / "target")
    draft = build_eagle3_draft(tmp_path / "draft", target, [1, 2, 3])
    assert regen_main(["serve-command", str(draft), "--target", "/models/Kimi-K2.5",
                       "--family", "kimi"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    sglang, vllm = (shlex.split(line) for line in out.splitlines() if not line.startswith("#"))
    assert sglang[:3] == ["python", "-m", "sglang.launch_server"]
    assert vllm[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    pairs = dict(itertools.pairwise(vllm))
    spec = json.loads(pairs["--speculative-config"])
    copy = Path(spec["model"])
    assert spec["method"] == "eagle3" and copy == tmp_path / "draft-vllm"
    assert pairs["--tool-call-parser"] == pairs["--reasoning-parser"] == "kimi_k2"
    cfg = json.loads((copy / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    assert cfg["regen_vllm_draft"]["specforge_aux_layer_ids"] == [1, 2, 3]
    assert (copy / "model.safetensors").resolve() == (draft / "model.safetensors").resolve()
    # the SpecForge draft itself is untouched
    assert json.loads((draft / "config.json").read_text())["eagle_config"][
        "eagle_aux_hidden_state_layer_ids"
    ] == [1, 2, 3]


def test_verify_server_passes_the_vllm_copy(vllm_spec_server, engine_models, capsys) -> None:
    rc = regen_main(["verify-server", vllm_spec_server.url, "--draft",
                     str(engine_models["draft_vllm"])])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    text = " ".join(out.split())
    assert "vLLM 0.32.0 speculating" in text and "3 draft tokens" in text
    assert "aux layers [2, 3, 4] (trained on [1, 2, 3])" in text
    assert "unchecked: the speculative method" in text  # vLLM does not expose it


def test_verify_server_refuses_what_vllm_would_capture_wrong(
    vllm_spec_server, vllm_server, engine_models, tmp_path, capsys
) -> None:
    # the SpecForge export as is: vLLM would capture every aux layer one early
    assert regen_main(["verify-server", vllm_spec_server.url, "--draft",
                       str(engine_models["draft"])]) == 2  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert "[aux-layer-numbering]" in err and "[0, 1, 2]" in err
    # a copy whose ids were edited afterwards
    edited = tmp_path / "edited"
    edited.mkdir()
    cfg = json.loads((engine_models["draft_vllm"] / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    (edited / "config.json").write_text(json.dumps(cfg))
    assert regen_main(["verify-server", vllm_spec_server.url, "--draft", str(edited)]) == 2
    assert "[aux-layer-numbering]" in capsys.readouterr().err
    # a server that does not speculate at all
    assert regen_main(["verify-server", vllm_server.url, "--draft",
                       str(engine_models["draft_vllm"])]) == 2  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert "[eagle-vs-eagle3]" in err and "runs no speculative decoding" in err


def test_bench_reads_acceptance_from_vllms_counters(
    vllm_server, vllm_spec_server, engine_models, tmp_path
) -> None:
    prompts = tmp_path / "holdout.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out = tmp_path / "bench"
    rc = regen_main(["bench", "--baseline", vllm_server.url, "--speculative",
                     vllm_spec_server.url, "--prompts", str(prompts), "--per-source", "2",
                     "--concurrency", "1,2", "--max-tokens", "16", "--temperature", "0",
                     "--out", str(out), "--draft", str(engine_models["draft_vllm"])])  # fmt: skip
    assert rc == 0
    report = read_report(out / "bench.json")
    spec, base = report.servers["speculative"], report.servers["baseline"]
    assert (spec.engine, base.engine) == ("vllm", "vllm")
    assert spec.trap is None and base.trap is None, (spec.problem, base.problem)
    assert spec.num_draft_tokens == 3
    assert report.acceptance.method == "metrics" and report.acceptance.exact
    assert report.acceptance.overall is not None and report.acceptance.overall >= 1.0
    by_source = {s.source: s for s in report.sources}
    assert set(by_source) == {"chat", "code"}
    assert all(s.method == "metrics" and s.accept_length is not None for s in by_source.values())
    # greedy: vLLM streamed each answer's ids (return_token_ids), and the draft changed none
    # of the concurrency-1 answers (4 prompts: two per source)
    g = report.greedy
    assert g is not None and (g.method, g.compared, g.identical) == ("token_ids", 4, 4)
    assert "greedy-identical" in {v.code for v in report.verdicts}
    # an untrained draft: acceptance at the floor, and the verdict says so
    assert report.acceptance.overall <= 1.1
    assert "draft-not-used" in {v.code for v in report.verdicts}
    print(
        f"\nvLLM bench: acceptance {report.acceptance.overall:.3f} (metrics), per source "
        f"{ {k: round(v.accept_length, 3) for k, v in by_source.items()} }"
    )
