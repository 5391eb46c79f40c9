"""End to end: `regen demo` with 2 real `transformers serve` processes (tiny model) and 2 actors.

Issue 4 acceptance: >= 60 demo samples, every kept sample has its rows, the stored usage is the
servers' (completion tokens as the server counted them, prompt tokens equal to the prompt we
rendered for the turn), both servers answered, and the export was written.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from regen.cli.main import main as regen_main
from regen.manifest import load_manifest
from regen.plan.index import native_check as _native_check
from regen.sources import read_samples, source_set
from regen.store import RunDir, layout

pytestmark = [pytest.mark.ray, pytest.mark.server]

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "manifests" / "demo.yaml"


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, ray_head, demo_target: Path) -> dict:
    tmp = tmp_path_factory.mktemp("demo")
    out, export = tmp / "run", tmp / "export"
    # the checkout's demo target (built once, outside any test's timeout): its build is
    # tests/devkit/servers's and scripts/test's, not a 300 s setup of its own here
    rc = regen_main(["demo", "--manifest", str(DEMO), "--out", str(out), "--export", str(export),
                     "--cache", str(demo_target.parent), "--servers", "2", "--workers", "2",
                     "--address", ray_head.address, "--no-view"])  # fmt: skip
    assert rc == 0
    rows = [
        r for p in sorted((out / "parts").glob("*.parquet")) for r in pq.read_table(p).to_pylist()
    ]
    manifest = load_manifest(DEMO)
    inputs = list(read_samples(sources := source_set(manifest), None, _native_check(sources)))
    return {"out": out, "export": export, "rows": rows, "inputs": inputs, "manifest": manifest}


def test_every_kept_sample_has_its_rows(demo_run) -> None:
    inputs, rows = demo_run["inputs"], demo_run["rows"]
    assert len(inputs) >= 60
    assert {r["sample_id"] for r in rows} == {s.id for s in inputs}
    keys = Counter((r["sample_id"], r["turn"]) for r in rows)
    assert max(keys.values()) == 1
    by_id = {s.id: s for s in inputs}
    for sid, n in Counter(r["sample_id"] for r in rows).items():
        assert 1 <= n <= max(1, by_id[sid].turns_to_regenerate())


def test_usage_is_the_servers(demo_run) -> None:
    m = demo_run["manifest"]
    regen_rows = [r for r in demo_run["rows"] if r["token_source"] != "native"]
    assert {r["endpoint"] for r in regen_rows} == set(
        RunDir.open(demo_run["out"]).read_json("run.json")["endpoints"]
    )
    assert len({r["endpoint"] for r in regen_rows}) == 2
    # the loop cut (quality.loop_cut, on by default) cut none of the demo target's answers
    assert not [r["sample_id"] for r in regen_rows if r["finish_reason"] == "loop"]
    turns_all = {s.name for s in m.sources if s.turns == "all"}
    for r in regen_rows:
        assert r["completion_tokens"] is not None and r["prompt_tokens"] is not None
        if r["finish_reason"] == "length":
            assert r["completion_tokens"] == m.sampling.max_tokens
        else:
            assert 0 < r["completion_tokens"] <= m.sampling.max_tokens
        if r["source"] not in turns_all:
            continue
        # history = the user turns and our own replies, as the row renders them. transformers
        # serve keeps only role, content, tool_calls and tool_call_id of a request message
        # (cli/serving/utils.py get_processor_inputs_from_messages), so two kinds of history
        # count fewer prompt tokens on the server than the row holds:
        # - the reasoning of the assistant turns after the last one without tool calls, which
        #   the Kimi template renders (CONTRACTS §1);
        # - a tool result's `name`, which the Kimi template renders in its header (name or
        #   role).
        # Raw markup a reply kept in its content is read as special tokens on both sides
        # (tests/targets/test_markup_in_content.py).
        messages = json.loads(r["messages"])
        rendered = r["num_tokens"] - r["loss_tokens"]
        why = (r["sample_id"], r["turn"], r["prompt_tokens"], rendered)
        if _reasoning_kept_in_history(messages) or _named_tool_result(messages):
            assert r["prompt_tokens"] < rendered, why
        else:
            assert r["prompt_tokens"] == rendered, why
    progress = RunDir.open(demo_run["out"]).read_json("progress.json")
    assert progress["state"] == "finished"
    stored = sum(r["completion_tokens"] for r in demo_run["rows"])
    assert sum(s["completion_tokens"] for s in progress["sources"].values()) == stored
    assert progress["requests"]["ok"] == len(regen_rows)
    assert sum(progress["output_tokens_hist"]["counts"]) == len(regen_rows)


def _named_tool_result(messages: list[dict]) -> bool:
    return any(m["role"] == "tool" and m.get("name") for m in messages)


def _reasoning_kept_in_history(messages: list[dict]) -> bool:
    """The Kimi template's rule (CONTRACTS §1): the reasoning of every assistant turn after the
    last one without tool calls is rendered; earlier ones get an empty think block."""
    plain = max((i for i, m in enumerate(messages)
                 if m["role"] == "assistant" and not m.get("tool_calls")), default=-1)  # fmt: skip
    return any(m["role"] == "assistant" and m.get("reasoning_content")
               for m in messages[plain + 1 :])  # fmt: skip


def test_export_written(demo_run) -> None:
    """The demo exports with its manifest's export section (drop_truncated, the default
    drop_flags, keep_unproven off): every row is written or dropped for the reason its own
    columns give, in export's order (flagged, then unproven tokens, then truncated)."""
    from regen.export.select import unproven

    stats = json.loads((demo_run["export"] / "stats.json").read_text())
    rows, drop_flags = demo_run["rows"], set(stats["drop_flags"])
    export = demo_run["manifest"].export
    assert export.drop_truncated and drop_flags and not export.keep_unproven
    flagged = [r for r in rows if drop_flags & set(r["quality_flags"] or ())]
    local = [r for r in rows if r not in flagged and unproven(r["token_source"], r["token_check"])]
    truncated = [r for r in rows if r["truncated"] and r not in flagged and r not in local]
    assert stats["dropped"] == {
        k: len(v)
        for k, v in (("flagged", flagged), ("unproven_tokens", local), ("truncated", truncated))
        if v
    }
    assert stats["rows_read"] == len(rows) and stats["keep_unproven"] is False
    written = len(rows) - len(flagged) - len(local) - len(truncated)
    assert stats["rows_written"] == written > 0.6 * len(rows)
    with (demo_run["export"] / "shard-00000.jsonl").open() as f:
        first = json.loads(f.readline())
    assert len(first["input_ids"]) == len(first["loss_mask"])


def test_plan_json_counts_the_requests_each_source_needs(demo_run) -> None:
    plan = layout.PLAN_FILE.read(RunDir.open(demo_run["out"])).sources
    expect: dict[str, list[int]] = {}
    for s in demo_run["inputs"]:
        if s.mode == "regenerate":
            e = expect.setdefault(s.source, [0, 0])
            e[0] += 1
            e[1] += s.turns_to_regenerate()
    for name, (n, turns) in expect.items():
        assert (plan[name].regenerate_todo, plan[name].regenerate_turns) == (n, turns)
