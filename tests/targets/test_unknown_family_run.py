"""A target of no family regen knows, served with its own ids: it regenerates, exports and
plans its training with SpecForge; asked for the local render, the run is refused in one line.

The target's tokenizer is the tiny BPE of the demo with ChatML framing tokens only
(``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``) and a ChatML template of its own: no
family recognises it (Qwen3 wants ``<think>`` and ``<tool_call>``, Kimi ``<|im_middle|>``).
``regen simulate`` tokenizes with it and streams its ids (SGLang's ``sglext``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from regen.cli.main import main as regen_main
from regen.devkit.simulate.testing import running_simulator
from regen.targets import recognise_dir

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "manifests" / "demo.yaml"
KIMI_TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"
CHATML = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
    "{%- if m.content is string %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)
RUN_TIMEOUT_S = 240


def chatml_tokenizer(out: Path) -> Path:
    """The demo's BPE without Kimi's tokens, with ChatML's, and a ChatML template."""
    data = json.loads((KIMI_TOKENIZER / "tokenizer.json").read_text(encoding="utf-8"))
    base = len(data["model"]["vocab"])
    data["added_tokens"] = [
        {"id": base + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, t in enumerate(("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
    ]  # fmt: skip
    out.mkdir()
    (out / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "chat_template": CHATML}  # fmt: skip
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out


def manifest_for(tokenizer: Path, out: Path) -> Path:
    """manifests/demo.yaml on that tokenizer, without its Kimi-native source."""
    data: dict[str, Any] = yaml.safe_load(DEMO.read_text())
    data["target"]["tokenizer"] = str(tokenizer)
    data["sources"] = [s for s in data["sources"] if s["adapter"] != "kimi_native"]
    for s in data["sources"]:
        s["path"] = str((DEMO.parent / s["path"]).resolve())
    out.write_text(yaml.safe_dump(data))
    return out


def regen_run(manifest: Path, out: Path, url: str, address: str, env: dict[str, str],
              *extra: str) -> subprocess.CompletedProcess[str]:  # fmt: skip
    cmd = [sys.executable, "-m", "regen", "--log-level", "WARNING", "run", str(manifest),
           "--out", str(out), "--endpoint", url, "--address", address, "--workers", "1",
           "--concurrency", "8", "--no-view", *extra]  # fmt: skip
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def unknown(tmp_path_factory, ray_head, ray_env) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("unknown-family")
    tok = chatml_tokenizer(tmp / "tokenizer")
    manifest = manifest_for(tok, tmp / "manifest.yaml")
    with running_simulator(model_name="demo-target", instant=True, mean_tokens=24,
                           tokenizer=str(tok)) as sim:  # fmt: skip
        served = regen_run(manifest, tmp / "run", sim.url, ray_head.address, ray_env)
        local = regen_run(manifest, tmp / "local", sim.url, ray_head.address, ray_env,
                          "-o", "sampling.token_ids=local")  # fmt: skip
    return {"tmp": tmp, "tok": tok, "run": tmp / "run", "served": served, "local": local}


def test_no_family_recognises_the_tokenizer(unknown) -> None:
    assert recognise_dir(unknown["tok"]) is None


def test_it_regenerates_with_the_servers_ids_and_records_the_family(unknown) -> None:
    import pyarrow.parquet as pq

    assert unknown["served"].returncode == 0, unknown["served"].stderr[-3000:]
    assert "model family is unknown" in unknown["served"].stderr  # said once, at start
    assert unknown["served"].stderr.count("model family is unknown") == 1
    rows = [r for p in sorted((unknown["run"] / "parts").glob("*.parquet"))
            for r in pq.read_table(p).to_pylist()]  # fmt: skip
    assert len(rows) > 50
    assert {r["token_source"] for r in rows} == {"server"}
    assert {r["token_check"] for r in rows} == {"server_only"}
    assert {r["family"] for r in rows} == {"unknown"}
    recorded = yaml.safe_load((unknown["run"] / "manifest.yaml").read_text())
    assert recorded["target"]["family"] == "unknown"


def test_asked_for_the_local_render_it_is_refused_in_one_line(unknown) -> None:
    proc = unknown["local"]
    assert proc.returncode == 2
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "target.family" in errors[0], proc.stderr[-2000:]
    assert not (unknown["tmp"] / "local" / "parts").exists()


def test_it_exports_and_specforge_accepts_every_row(unknown, tmp_path: Path) -> None:
    from regen.train.preflight import prompt_tasks

    out = tmp_path / "export"
    assert regen_main(["export", str(unknown["run"]), "--out", str(out), "--shard-rows", "0",
                       "--drop-flags", "none", "--keep-truncated"]) == 0  # fmt: skip
    stats = json.loads((out / "stats.json").read_text())
    lines = (out / "shard-00000.jsonl").read_text().splitlines()
    assert stats["token_check_problems"] == 0 and stats["rows_written"] == len(lines) > 50
    tasks = prompt_tasks(out / "shard-00000.jsonl", max_length=1_000_000)
    assert [t["payload"] for t in tasks] == [json.loads(line) for line in lines]


def test_its_training_is_planned_by_specforge(unknown, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(unknown["run"], run)
    cfg = yaml.safe_load((REPO / "manifests" / "demo-train.yaml").read_text())
    cfg["target"].update({"path": str(unknown["tok"]), "vocab_size": 1024,
                          "tokenizer_size": 1012})  # fmt: skip
    cfg["draft"].update({"vocab_size": 1024, "pad_token_id": 1009})
    cfg["output_dir"] = str(tmp_path / "draft")
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert regen_main(["train", str(run), "--config", str(path), "--dry-run"]) == 0
    assert (run / "train" / "run.yaml").exists()
