"""`regen run` on a target of each family below, served by real vLLM 0.32 (CPU): Kimi, Qwen3,
DeepSeek-V3.1, Qwen3-Coder and GLM-4.5 (whose templates need history tool-call arguments as
objects), GLM-4.7, DeepSeek-V4 (DSML; vLLM encodes its prompts in Python, ``--tokenizer-mode
deepseek_v4``, and so does regen), and a target of a format no family module describes, known
only by its tokenizer's ``response_template`` (Ember, ``--tool-call-parser hf
--reasoning-parser hf``).

Per family: its demo target (regen.devkit.demo_target, built once per checkout under
``.cache/demo-model-FAMILY``; Kimi's is the ``demo_target`` fixture's ``.cache/demo-model``)
is served by one vLLM server with that family's flags (``Family.vllm_flags``), and ``regen run``
regenerates a short slice of the family's demo manifest (a few samples of every source, the
tool-call sources xlam, glaive and swe_gym included). No sample fails permanently (DeepSeek-V3.1's
requests with a tool call in their history included: its demo target is served with the
template a real V3.1 needs, its manifest's ``target.chat_template``, which the local render
uses too). On the rows of the run's parts:

- every finished row holds the server's own ids (``token_source == "server"``);
- the local render (the family's response assembly after its prompt, as the engine prepared the
  request for the template or its encoder) agrees with them (``token_check == "match"``) on
  every row without a quality flag (>= 99% for the three families of before, as measured then);
- every tool-call row's calls parse (non-empty, names among the declared tools) and no content
  holds an unparsed call;
- the reasoning is split (non-empty on every finished thinking row), but for the answers to a
  tool output of a family in ``UNSPLIT_AFTER_TOOL`` (DeepSeek-V3.1: vLLM's parser leaves their
  ``<think>...</think>`` in the content; checked to be so).

The per-family numbers are printed (``-s``) and appended as JSON lines to
``$REGEN_FAMILY_TABLE`` when set.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _runs import stored_rows

from regen.core.result import LOOP

pytestmark = [pytest.mark.vllm, pytest.mark.ray]

REPO = Path(__file__).resolve().parents[2]
#: family → (its demo manifest, the cache folder of its demo target)
CASES: dict[str, tuple[str, str]] = {
    "qwen3": ("demo-qwen3.yaml", "demo-model-qwen3"),
    "deepseek_v3": ("demo-deepseek.yaml", "demo-model-deepseek_v3"),
    "kimi": ("demo.yaml", "demo-model"),
    "qwen3_coder": ("demo-qwen3-coder.yaml", "demo-model-qwen3_coder"),
    "glm45": ("demo-glm45.yaml", "demo-model-glm45"),
    "glm47": ("demo-glm47.yaml", "demo-model-glm47"),
    "deepseek_v4": ("demo-deepseek-v4.yaml", "demo-model-deepseek_v4"),
    "response_template": ("demo-ember.yaml", "demo-model-response_template"),
}
#: samples per source: the tool-call sources get more (about 25 samples in all)
TOOL_SOURCES = ("xlam", "glaive", "swe_gym")
LIMIT, TOOL_LIMIT = 2, 4
#: the share of rows without a flag whose local render agrees: every one, but for the families
#: of before, held to the share measured then
MIN_MATCH = {"qwen3": 0.99, "deepseek_v3": 0.99, "kimi": 0.99}
#: families whose answers to a tool output vLLM 0.32 leaves unsplit: DeepSeek-V3.1's template
#: opens no ``<think>`` after a tool output and its history call turns hold ``</think>``, and
#: vLLM's deepseek_v3 (R1) reasoning parser takes a prompt whose last think token is ``</think>``
#: as reasoning ended, so the answer's ``<think>...</think>`` stays in the content
UNSPLIT_AFTER_TOOL = ("deepseek_v3",)


def overrides(manifest: Path) -> list[str]:
    """``-o sources.X.limit=N`` for every regenerated source (Kimi's native rows left out)."""
    from regen.manifest import load_manifest

    out: list[str] = []
    for s in load_manifest(manifest).sources:
        limit = 0 if s.mode == "native" else TOOL_LIMIT if s.name in TOOL_SOURCES else LIMIT
        out += ["-o", f"sources.{s.name}.limit={limit}"]
    return out


@pytest.fixture(scope="module", params=list(CASES))
def family_run(
    request: pytest.FixtureRequest, vllm_python: Path, ray_head: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:  # fmt: skip
    """One family's run: its demo target served by one vLLM server with its parsers (the uni
    executor: a short run without a draft, VllmServer's docstring)."""
    from regen.cli.main import main as regen_main
    from regen.devkit.servers import build_demo_target
    from regen.devkit.servers.vllm import VllmServer
    from regen.manifest import load_manifest

    name = request.param
    manifest_name, folder = CASES[name]
    manifest = REPO / "manifests" / manifest_name
    fam = load_manifest(manifest).family()
    assert fam is not None and fam.name == name, f"{manifest_name}: recognised {fam}"
    model = build_demo_target(REPO / ".cache" / folder, manifest)
    tmp = tmp_path_factory.mktemp(f"family-{name}")
    served = load_manifest(manifest).target.model
    srv = VllmServer(vllm_python, model, served_name=served, family=fam,
                     max_model_len=4096, max_num_seqs=8, uni_executor=True,
                     log_path=tmp / "vllm.log")  # fmt: skip
    with srv:
        out = tmp / "run"
        argv = ["run", str(manifest), "--out", str(out), "--endpoint", srv.url,
                "--address", ray_head.address, "--no-view", *overrides(manifest)]  # fmt: skip
        rc = regen_main(argv)

    yield {"family": fam, "rc": rc, "rows": stored_rows(out), "start_s": srv.start_s,
           "failed": permanent_failures(out)}  # fmt: skip


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
        "after_tool_rows": sum(_after_tool(r) for r in done),
    }  # fmt: skip


def test_the_run_finishes_and_reports(family_run: dict[str, Any]) -> None:
    name = family_run["family"].name
    numbers = {"family": name, **table(family_run["rows"]),
               "failed_permanently": len(family_run["failed"]),
               "vllm_start_s": family_run["start_s"]}  # fmt: skip
    print(f"\n{json.dumps(numbers)}")
    path = os.environ.get("REGEN_FAMILY_TABLE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(numbers) + "\n")
    assert family_run["rc"] == 0
    assert not family_run["failed"], family_run["failed"]
    assert numbers["rows"] >= 25


def test_every_row_is_the_servers_ids(family_run: dict[str, Any]) -> None:
    done = [r for r in family_run["rows"] if r["token_source"] != "native"]
    assert done and all(r["token_source"] == "server" for r in done)
    # the loop cut (quality.loop_cut, on by default) cut none of the demo target's answers
    assert not [r["sample_id"] for r in done if r["finish_reason"] == LOOP]
    assert all(r["family"] == family_run["family"].name for r in done)


def test_the_local_render_matches_the_server(family_run: dict[str, Any]) -> None:
    rows = [r for r in family_run["rows"] if r["token_source"] == "server"]
    clean = [r for r in rows if not r["quality_flags"] and not r["truncated"]]
    bad = [(r["sample_id"], r["turn"], r["token_check"]) for r in clean
           if r["token_check"] != "match"]  # fmt: skip
    assert clean
    assert 1 - len(bad) / len(clean) >= MIN_MATCH.get(family_run["family"].name, 1.0), bad


def test_tool_calls_parse_into_declared_tools(family_run: dict[str, Any]) -> None:
    fam = family_run["family"]
    done = [r for r in family_run["rows"] if r["token_source"] == "server"]
    # a call cut by max_tokens parses into what was written of it (Qwen3-Coder's verbose XML
    # calls: a second call's name cut short): the finished ones are held to the declared tools
    tool_rows = [r for r in done if not r["truncated"]
                 and (r["finish_reason"] == "tool_calls" or _calls(r))]  # fmt: skip
    assert len(tool_rows) >= 4, "the demo target calls the offered tools"
    for r in tool_rows:
        calls = _calls(r)
        assert calls, (r["sample_id"], r["turn"])
        names = {(c.get("function") or c).get("name") for c in calls}
        assert names <= _declared(r), (r["sample_id"], names)
    for r in done:  # no call left unparsed in the content
        assert not any(m in (r["content"] or "") for m in fam.call_markers), r["sample_id"]


def _after_tool(row: dict[str, Any]) -> bool:
    """The row answers a tool output (its request ends with a tool message)."""
    messages = json.loads(row["messages"] or "[]")
    return bool(messages) and messages[-1].get("role") == "tool"


def test_reasoning_is_split(family_run: dict[str, Any]) -> None:
    fam = family_run["family"]
    done = [r for r in family_run["rows"] if r["token_source"] == "server" and not r["truncated"]]
    if fam.name in UNSPLIT_AFTER_TOOL:  # vLLM leaves these in the content: they hold it whole
        known = [r for r in done if _after_tool(r)]
        assert all(not r["reasoning"] and (r["content"] or "").startswith(fam.think[0])
                   and fam.think[1] in r["content"] for r in known), known  # fmt: skip
        done = [r for r in done if not _after_tool(r)]
    missing = [(r["sample_id"], r["turn"]) for r in done if not r["reasoning"]]
    assert not missing
    if fam.think is not None:
        assert not any(fam.think[1] in (r["content"] or "") for r in done)
