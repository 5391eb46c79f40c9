"""`turns: all` tool turns against a real vLLM: the calls compared are what vLLM's kimi_k2
tool-call parser returned. The scripted target (thinking off) always calls
``lookup({"q": 7})``: a conversation whose original calls that (other whitespace, the same
JSON) continues with the original tool results; one whose original called another function
or passed other arguments ends at that turn, its reason on the row and counted per source.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _models import TOOL_NAME

from regen.engine import RunOptions, run_job
from regen.engine.turns import TOOL_CALL_ARGUMENTS, TOOL_CALL_NAME
from regen.manifest import load_manifest
from regen.store import RunDir

pytestmark = [pytest.mark.vllm, pytest.mark.ray]

TOKENIZER = Path(__file__).resolve().parents[2] / "manifests" / "demo" / "tokenizer"
TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} a value",
          "parameters": {"type": "object", "properties": {"q": {"type": "integer"}}}}}
         for n in (TOOL_NAME, "search")]  # fmt: skip


def conversation(cid: str, name: str, args: str, then: list[dict]) -> dict:
    call = {"id": f"call_{cid}", "type": "function", "function": {"name": name, "arguments": args}}
    return {
        "prompt_id": cid,
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": f"what is q? ({cid})"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "q is seven", "tool_call_id": f"call_{cid}"},
            *then,
        ],
    }


def write_source(tmp: Path) -> Path:
    again = {"id": "call_again", "type": "function",
             "function": {"name": TOOL_NAME, "arguments": '{"q":7}'}}  # fmt: skip
    rows = [
        # the same call twice (compact JSON: the parser returns {"q": 7}), then an answer
        conversation("match", TOOL_NAME, '{"q":7}', [
            {"role": "assistant", "content": "", "tool_calls": [again]},
            {"role": "tool", "content": "still seven", "tool_call_id": "call_again"},
            {"role": "assistant", "content": "q is 7."}]),
        conversation("name", "search", '{"q": 7}', [{"role": "assistant", "content": "7."}]),
        conversation("args", TOOL_NAME, '{"q": 8}', [{"role": "assistant", "content": "8."}]),
    ]  # fmt: skip
    (tmp / "tools.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = tmp / "m.yaml"
    m.write_text(
        f"name: tool-turns\ntarget: {{model: demo-target, tokenizer: {TOKENIZER}}}\n"
        "sampling: {max_tokens: 40, thinking: false, seed: 0}\n"
        "engine: {workers: 1, concurrency: 3}\n"
        "sources:\n  - {name: agent, adapter: swe_gym, path: tools.jsonl, turns: all}\n"
    )
    return m


def test_tool_turns_continue_only_on_matching_calls(tmp_path, vllm_server, ray_head) -> None:
    out = tmp_path / "run"
    opts = RunOptions(endpoints=[vllm_server.url], address=ray_head.address)
    summary = run_job(load_manifest(write_source(tmp_path)), RunDir.open(out, create=False), opts)
    assert summary.state == "finished" and summary.done == 3
    parts = sorted((out / "parts").glob("*.parquet"))
    rows = [r for p in parts for r in pq.read_table(p).to_pylist()]
    by: dict[str, list[dict]] = {}
    for r in sorted(rows, key=lambda r: r["turn"]):
        by.setdefault(r["sample_id"].split(":")[1].split("#")[0], []).append(r)
    calls = [json.loads(r["tool_calls"]) for r in by["match"]]
    # the parser's calls (vLLM's ids, spaced JSON) matched the original's: continued twice
    assert [r["turn"] for r in by["match"]] == [0, 1, 2]
    assert [c[0]["function"]["name"] for c in calls[:2]] == [TOOL_NAME, TOOL_NAME]
    assert all(json.loads(c[0]["function"]["arguments"]) == {"q": 7} for c in calls[:2])
    later = json.loads(by["match"][1]["messages"])[-1]  # re-addressed to vLLM's call id
    assert (later["role"], later["content"]) == ("tool", "q is seven")
    assert later["tool_call_id"] == calls[0][0]["id"] == "functions.lookup:0"
    assert [r["ended"] for r in by["match"]] == [None, None, None]
    # another function, or other arguments: ended at the first turn, the reason recorded
    assert [(r["turn"], r["ended"]) for r in by["name"]] == [(0, TOOL_CALL_NAME)]
    assert [(r["turn"], r["ended"]) for r in by["args"]] == [(0, TOOL_CALL_ARGUMENTS)]
    progress = RunDir.open(out).read_json("progress.json")
    assert progress["sources"]["agent"]["ended"] == {TOOL_CALL_NAME: 1, TOOL_CALL_ARGUMENTS: 1}
