"""What the rows of a `regen run` against a real vLLM server serving a family's demo target are
held to: the per-family runs of tests/engines/test_families_vllm.py, and Kimi's, the demo
loop's first round (tests/devkit/loop/test_demo_loop.py, the whole Kimi demo on vLLM).

- every finished row holds the server's own ids (``token_source == "server"``), and the loop
  cut (quality.loop_cut, on by default) cut none of the demo target's answers;
- the local render agrees with them (``token_check == "match"``) on every row without a
  quality flag (>= 99% for the three families of before, as measured then);
- every tool-call row's calls parse (non-empty) and name declared tools, but where regen flagged
  the row ``bad_tool_call`` (a tiny demo target misspells a name now and then: Qwen3-Coder's
  once in six tool rows here on 2026-12-07, the same row in every run of that machine), at
  least four rows and three in four of them; no content holds an unparsed call;
- the reasoning is split (non-empty on every finished thinking row), but for the answers to a
  tool output of a family in ``UNSPLIT_AFTER_TOOL`` (DeepSeek-V3.1: vLLM's parser leaves their
  ``<think>...</think>`` in the content; checked to be so).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from regen.core.result import LOOP
from regen.targets import Family

#: the share of rows without a flag whose local render agrees: every one, but for the families
#: of before, held to the share measured then
MIN_MATCH = {"qwen3": 0.99, "deepseek_v3": 0.99, "kimi": 0.99}
#: families whose answers to a tool output vLLM 0.32 leaves unsplit: DeepSeek-V3.1's template
#: opens no ``<think>`` after a tool output and its history call turns hold ``</think>``, and
#: vLLM's deepseek_v3 (R1) reasoning parser takes a prompt whose last think token is ``</think>``
#: as reasoning ended, so the answer's ``<think>...</think>`` stays in the content
UNSPLIT_AFTER_TOOL = ("deepseek_v3",)


def permanent_failures(run_dir: Path) -> list[tuple[str, str]]:
    """(sample id, message) of every permanently failed sample of the run."""
    from regen.store.layout import FAILURES_DIR

    out: list[tuple[str, str]] = []
    for path in sorted((run_dir / FAILURES_DIR).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec.get("permanent"):
                out.append((rec["sample_id"], rec["message"]))
    return out


def _calls(row: dict[str, Any]) -> list[dict[str, Any]]:
    return json.loads(row["tool_calls"] or "[]")


def _declared(row: dict[str, Any]) -> set[str]:
    tools = json.loads(row["tools"] or "[]") or []
    return {(t.get("function") or t).get("name") for t in tools}


def after_tool(row: dict[str, Any]) -> bool:
    """The row answers a tool output (its request ends with a tool message)."""
    messages = json.loads(row["messages"] or "[]")
    return bool(messages) and messages[-1].get("role") == "tool"


def table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-family numbers of the report."""
    done = [r for r in rows if r["token_source"] != "native"]
    clean = [r for r in done if not r["quality_flags"] and not r["truncated"]]
    return {
        "rows": len(done),
        "server_pct": round(100 * sum(r["token_source"] == "server" for r in done)
                            / max(1, len(done)), 1),
        "match_pct": round(100 * sum(r["token_check"] == "match" for r in clean)
                           / max(1, len(clean)), 1),
        "clean_rows": len(clean),
        "flagged_rows": len(done) - len(clean),
        "tool_rows": sum(bool(_calls(r)) for r in done),
        "reasoning_rows": sum(bool(r["reasoning"]) for r in done),
        "after_tool_rows": sum(after_tool(r) for r in done),
    }  # fmt: skip


def check_server_ids(rows: list[dict[str, Any]], fam: Family) -> None:
    done = [r for r in rows if r["token_source"] != "native"]
    assert done and all(r["token_source"] == "server" for r in done)
    # the loop cut (quality.loop_cut, on by default) cut none of the demo target's answers
    assert not [r["sample_id"] for r in done if r["finish_reason"] == LOOP]
    assert all(r["family"] == fam.name for r in done)


def check_render_matches(rows: list[dict[str, Any]], fam: Family) -> None:
    rows = [r for r in rows if r["token_source"] == "server"]
    clean = [r for r in rows if not r["quality_flags"] and not r["truncated"]]
    bad = [(r["sample_id"], r["turn"], r["token_check"]) for r in clean
           if r["token_check"] != "match"]  # fmt: skip
    assert clean
    assert 1 - len(bad) / len(clean) >= MIN_MATCH.get(fam.name, 1.0), bad


def check_tool_calls(rows: list[dict[str, Any]], fam: Family) -> None:
    done = [r for r in rows if r["token_source"] == "server"]
    # a call cut by max_tokens parses into what was written of it (Qwen3-Coder's verbose XML
    # calls: a second call's name cut short): the finished ones are held to the declared tools
    tool_rows = [r for r in done if not r["truncated"]
                 and (r["finish_reason"] == "tool_calls" or _calls(r))]  # fmt: skip
    fit = []
    for r in tool_rows:
        calls = _calls(r)
        assert calls, (r["sample_id"], r["turn"])
        names = {(c.get("function") or c).get("name") for c in calls}
        if names <= _declared(r):
            fit.append(r)
        else:  # a tiny target misspells a name now and then: regen flags the row
            assert "bad_tool_call" in r["quality_flags"], (r["sample_id"], names)
    assert len(fit) >= 4, "the demo target calls the offered tools"
    assert len(fit) >= 0.75 * len(tool_rows), [r["sample_id"] for r in tool_rows if r not in fit]
    for r in done:  # no call left unparsed in the content
        assert not any(m in (r["content"] or "") for m in fam.call_markers), r["sample_id"]


def check_reasoning_split(rows: list[dict[str, Any]], fam: Family) -> None:
    done = [r for r in rows if r["token_source"] == "server" and not r["truncated"]]
    if fam.name in UNSPLIT_AFTER_TOOL:  # vLLM leaves these in the content: they hold it whole
        known = [r for r in done if after_tool(r)]
        assert all(not r["reasoning"] and (r["content"] or "").startswith(fam.think[0])
                   and fam.think[1] in r["content"] for r in known), known  # fmt: skip
        done = [r for r in done if not after_tool(r)]
    missing = [(r["sample_id"], r["turn"]) for r in done if not r["reasoning"]]
    assert not missing
    if fam.think is not None:
        assert not any(fam.think[1] in (r["content"] or "") for r in done)
