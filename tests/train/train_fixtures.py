"""Helpers for the regen.train tests: Kimi-framed pre-tokenized rows, exports, train configs."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEMO_TRAIN = REPO / "manifests" / "demo-train.yaml"

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
    (out / "stats.json").write_text(json.dumps({"rows": len(rows)}))
    return out


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        nested = isinstance(v, dict) and isinstance(out.get(k), dict)
        out[k] = deep_merge(out[k], v) if nested else v
    return out


def demo_config(**over: Any) -> dict[str, Any]:
    return deep_merge(yaml.safe_load(DEMO_TRAIN.read_text()), over)
