"""Helpers for the regen.train tests: Kimi-framed pre-tokenized rows, exports, train configs.

``kimi_config`` is a Kimi-K2.5-shaped train config (the production config on one GPU with a
local capture server) for the unit tests of the traps and the launch path on synthetic rows
with Kimi's ids; the demo's own config (manifests/demo-train.yaml) trains the demo target.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from regen.devkit.servers import TransformersServer

REPO = Path(__file__).resolve().parents[2]
DEMO_TRAIN = REPO / "manifests" / "demo-train.yaml"
PRODUCTION_TRAIN = REPO / "manifests" / "train-kimi-k25-eagle3.yaml"
#: the production config on one GPU, a few steps, a local capture server
KIMI_TEST_OVERRIDES: dict[str, Any] = {
    "run_id": "demo-eagle3",
    "output_dir": "/tmp/regen-demo-draft",
    "target": {"path": "models/Kimi-K2.5"},
    "training": {"max_steps": 10, "log_interval": 1, "max_length": 4096},
    "deployment": {"nproc_per_node": 1},
    "capture": {
        "server_urls": ["http://127.0.0.1:30000"],
        "mooncake": {
            "metadata_server": "http://127.0.0.1:8080/metadata",
            "master_server_addr": "127.0.0.1:50051",
            "protocol": "tcp",
        },
    },
}

# Kimi framing ids (CONTRACTS §1)
IM_USER, IM_ASSISTANT, IM_MIDDLE, IM_END = 163587, 163588, 163601, 163586
THINK_END = 163607


def kimi_row(prompt: list[int], answer: list[int]) -> dict[str, list[int]]:
    """One pre-tokenized row: framed prompt (no loss) + answer ending in <|im_end|> (loss)."""
    head = [IM_USER, 1, IM_MIDDLE, *prompt, IM_END, IM_ASSISTANT, 2, IM_MIDDLE]
    tail = [*answer, THINK_END, 5, IM_END]
    return {"input_ids": head + tail, "loss_mask": [0] * len(head) + [1] * len(tail)}


def good_rows(n: int = 6) -> list[dict[str, list[int]]]:
    return [kimi_row([100 + i, 200 + i], [300 + i, 400 + i, 500]) for i in range(n)]


def write_export(run_dir: Path, rows: list[dict[str, Any]], shards: int = 2) -> Path:
    out = run_dir / "export"
    out.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        with (out / f"shard-{s:05d}.jsonl").open("w", encoding="utf-8") as f:
            for row in rows[s::shards]:
                f.write(json.dumps(row) + "\n")
    return out


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        nested = isinstance(v, dict) and isinstance(out.get(k), dict)
        out[k] = deep_merge(out[k], v) if nested else v
    return out


def kimi_config(**over: Any) -> dict[str, Any]:
    """A Kimi-K2.5-shaped train config (module docstring) with ``over`` merged in."""
    base = deep_merge(yaml.safe_load(PRODUCTION_TRAIN.read_text()), KIMI_TEST_OVERRIDES)
    return deep_merge(base, over)


def demo_train_config(target: Path, **over: Any) -> dict[str, Any]:
    """manifests/demo-train.yaml against the built demo target ``target``."""
    base = yaml.safe_load(DEMO_TRAIN.read_text())
    return deep_merge(base, {"target": {"path": str(target)}, **over})


def served_run(
    manifest: Path,
    target: Path | TransformersServer,
    tmp: Path,
    address: str,
    env: dict[str, str],
    timeout_s: float,
) -> Path:
    """``regen run MANIFEST`` against ``transformers serve`` of ``target`` (started here), or
    against the running server ``target``, as ``regen demo`` runs it (one worker, eight in
    flight): the run directory ``tmp/run``."""
    from regen.devkit.servers import TransformersServer

    if isinstance(target, TransformersServer):
        return _run_against(manifest, target, tmp / "run", address, env, timeout_s)
    with TransformersServer(target, log_path=tmp / "serve.log") as srv:
        return _run_against(manifest, srv, tmp / "run", address, env, timeout_s)


def _run_against(
    manifest: Path,
    srv: TransformersServer,
    out: Path,
    address: str,
    env: dict[str, str],
    timeout_s: float,
) -> Path:
    cmd = [sys.executable, "-m", "regen", "--log-level", "WARNING", "run", str(manifest),
           "--out", str(out), "--endpoint", srv.url, "--address", address,
           "--workers", "1", "--concurrency", "8", "--no-view",
           "-o", f"target.model={srv.model_name}"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s, check=False)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return out
