"""The demo's Kimi rows, as regen made them before model families existed, rebuilt by today's
row builder from the answers they store: every column the builder decides is byte-identical.

tests/data/demo-rows-e7974ea.parquet holds the 84 rows (80 regenerated, 4 native) of
`./scripts/demo` at commit e7974ea (the last commit before regen/targets), less the columns a
run decides by time and place (created_at, latency_s, ttft_s, endpoint, model). ``ended`` is
the engine's (set on a sample's last row after the builder) and ``family`` did not exist then.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from regen.core.result import TurnResult
from regen.core.sample import ATTEMPT_META, Message, Sample, ToolCall
from regen.engine.inputs import render_settings
from regen.engine.rows import build_turn_row
from regen.manifest import load_manifest
from regen.template.render import Renderer, RenderSetup
from regen.template.tokenizer import class_spec, load_tokenizer

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "demo-rows-e7974ea.parquet"
#: columns the row builder does not decide
NOT_BUILT = ("ended", "family", "created_at", "latency_s", "ttft_s", "endpoint", "model")


def _answer(row: dict[str, Any]) -> TurnResult:
    calls = tuple(
        ToolCall(c.get("id") or "", c["function"]["name"], c["function"]["arguments"])
        for c in json.loads(row["tool_calls"])
    )
    return TurnResult(
        content=row["content"], reasoning=row["reasoning"], tool_calls=calls,
        finish_reason=row["finish_reason"], prompt_tokens=row["prompt_tokens"],
        completion_tokens=row["completion_tokens"], model=None, endpoint=None,
        reasoning_tokens=row["reasoning_tokens"], cached_tokens=row["cached_tokens"],
        attempts=row["attempts"], engine=row["engine"], engine_version=row["engine_version"],
    )  # fmt: skip


def _sample(row: dict[str, Any], messages: list[dict[str, Any]]) -> Sample:
    tools = json.loads(row["tools"]) if row["tools"] else None
    return Sample(
        id=row["sample_id"], source=row["source"],
        messages=[Message(m["role"], m.get("content") or "") for m in messages], tools=tools,
        meta={ATTEMPT_META: row["attempt"]},
    )  # fmt: skip


@pytest.fixture(scope="module")
def golden() -> list[dict[str, Any]]:
    return [r for r in pq.read_table(GOLDEN).to_pylist() if r["token_source"] != "native"]


@pytest.mark.parametrize("by_class", [False, True], ids=["autotokenizer", "by_class"])
def test_every_regenerated_demo_row_is_rebuilt_byte_for_byte(
    golden, by_class: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Both ways a worker loads the tokenizer: AutoTokenizer, and the class preflight recorded
    in checks.json (regen.template.tokenizer), which the actors load without torch."""
    manifest = load_manifest(REPO / "manifests" / "demo.yaml")
    tokenizer = manifest.resolve(manifest.target.tokenizer)
    spec = class_spec(load_tokenizer(tokenizer)) if by_class else None
    assert spec is not None or not by_class
    with caplog.at_level(logging.INFO, logger="regen.template.tokenizer"):
        renderer = Renderer.of(render_settings(manifest, RenderSetup(spec)))
    assert "resolving it again" not in caplog.text  # loaded by the class, not by the fallback
    assert len(golden) == 80 and renderer.family is not None and renderer.family.name == "kimi"
    differ: dict[str, list[str]] = {}
    for row in golden:
        messages = json.loads(row["messages"])
        built = build_turn_row(
            _sample(row, messages), row["turn"], messages, _answer(row), renderer,
            manifest.quality, settings=row["settings"],
        )  # fmt: skip
        built["content_hash"] = row["content_hash"]  # the source row's, not the builder's
        for column, value in row.items():
            if column not in NOT_BUILT and built[column] != value:
                differ.setdefault(column, []).append(f"{row['sample_id']}#{row['turn']}")
    assert differ == {}
    # plain turns and tool-call turns (Kimi's call section rebuilt), counts that agree with the
    # server's and counts that do not: all rebuilt
    assert {r["token_check"] for r in golden} == {"count_match", "count_mismatch"}
    assert sum(1 for r in golden if json.loads(r["tool_calls"])) >= 10
