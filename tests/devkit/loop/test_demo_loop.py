"""`regen demo --loop` end to end, on real programs at every step: vLLM serves the demo target,
regen regenerates, SpecForge trains on CPU, vLLM speculates with the draft, `regen bench` measures
it against the target alone and reweights, and a second round runs with the new limits.

Round 1's regeneration is the whole Kimi demo through vLLM with Kimi's parsers: its rows are
held to what every family's vLLM run is (tests/_vllm_rows.py; the other families:
tests/engines/test_families_vllm.py).

One loop run per module (about 20-30 minutes on two busy cores), shared by the assertions; they
read its loop.json, its bench reports and run directories, and its console output. Acceptance is
asserted against the never-trained draft of the same run, never against a fixed number, and no
speedup is asserted (on CPU the draft's forward costs about what the target's does).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from _runs import stored_rows
from _vllm_rows import (
    check_reasoning_split,
    check_render_matches,
    check_server_ids,
    check_tool_calls,
    permanent_failures,
    table,
)

from regen.bench.report import read_report
from regen.devkit.loop import record
from regen.devkit.loop.record import LoopRecord

#: bound on the whole loop (two vLLM starts per round, two CPU trainings)
LOOP_TIMEOUT_S = 3600

pytestmark = [pytest.mark.vllm, pytest.mark.ray, pytest.mark.timeout(LOOP_TIMEOUT_S + 300)]

REPO = Path(__file__).resolve().parents[3]
#: one level: the bench's levels are tested in tests/bench; each level here costs a baseline and a
#: speculative pass for each of the three drafts
LEVELS = [1]
STEPS = 60
#: "a clear margin": the trained draft accepts this much more per step than the untrained one
MARGIN = 0.2


@pytest.fixture(scope="module")
def loop(
    tmp_path_factory: pytest.TempPathFactory, demo_target: Path, ray_head, ray_env, vllm_python
) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("demo-loop") / "loop"
    env = {**ray_env, "REGEN_VLLM_VENV": str(vllm_python.parents[1]), "COLUMNS": "160"}
    cmd = [sys.executable, "-m", "regen", "--log-level", "WARNING", "demo", "--loop",
           "--out", str(out), "--cache", str(demo_target.parent), "--address", ray_head.address,
           "--workers", "1", "--concurrency", "8", "--no-view", "--train-steps", str(STEPS),
           "--bench-concurrency", ",".join(map(str, LEVELS))]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=LOOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the loop stops the servers it started
        stdout, stderr = proc.communicate(timeout=120)
        pytest.fail(f"the loop ran past {LOOP_TIMEOUT_S} s: {(stdout + stderr)[-4000:]}")
    assert proc.returncode == 0, (stdout + stderr)[-6000:]
    rec = record.read_record(out)
    print(f"\nloop: {rec.wall_s:.0f} s; " + "; ".join(
        f"{head} accept {b.accept_length:.3f} speedups "
        f"{[lv.speedup for lv in b.levels]}" for head, b in _columns(rec)))  # fmt: skip
    return {"out": out, "rec": rec, "stdout": stdout}


def _columns(rec: LoopRecord) -> list[tuple[str, Any]]:
    from regen.devkit.loop.summary import columns

    return columns(rec)


def test_two_rounds_each_benched_against_a_real_speculative_vllm(loop) -> None:
    rec: LoopRecord = loop["rec"]
    assert [r.round for r in rec.rounds] == [1, 2] and rec.untrained is not None
    for r in rec.rounds:
        report = read_report(r.bench.bench_json)
        spec, base = report.servers["speculative"], report.servers["baseline"]
        assert (spec.engine, base.engine) == ("vllm", "vllm")
        assert spec.trap is None and base.trap is None, (spec.problem, base.problem)
        assert spec.num_draft_tokens == rec.num_speculative_tokens
        # acceptance from vLLM's own counters, over the bench and per source
        assert report.acceptance.method == "metrics" and report.acceptance.exact
        assert report.settings.sampling["temperature"] == 0.0
        assert [lv.concurrency for lv in report.levels] == LEVELS
        assert all(lv.speedup is not None for lv in report.levels)
        holdout = Path(r.run_dir) / "export" / "holdout.jsonl"
        held = {json.loads(x)["source"] for x in holdout.read_text().splitlines()}
        assert set(r.bench.sources) == held and len(held) >= 8
        assert all(s.method == "metrics" and s.accept_length is not None for s in report.sources)


def test_round_ones_rows_are_what_a_kimi_run_on_vllm_must_hold(loop) -> None:
    """The server's ids, the local render agreeing, tool calls parsed, the reasoning split."""
    from regen.manifest import load_manifest

    fam = load_manifest(REPO / "manifests" / "demo.yaml").family()
    assert fam is not None and fam.name == "kimi"
    run_dir = Path(loop["rec"].rounds[0].run_dir)
    rows = stored_rows(run_dir)
    assert permanent_failures(run_dir) == []
    assert table(rows)["rows"] >= 25
    check_server_ids(rows, fam)
    check_render_matches(rows, fam)
    check_tool_calls(rows, fam)
    check_reasoning_split(rows, fam)


def test_greedy_answers_are_identical_with_and_without_the_draft(loop) -> None:
    for head, b in _columns(loop["rec"]):
        g = b.greedy
        assert g.prompts == b.prompts and g.prompts >= 16, head
        assert g.identical == g.prompts and not g.differing, (head, g.differing)
        assert g.tokens > 10 * g.prompts  # answers, not empty strings
        # the bench's own concurrency-1 answers, compared by the ids vLLM streamed
        greedy = read_report(Path(b.bench_json)).greedy
        assert greedy is not None and greedy.method == "token_ids", head


def test_the_trained_draft_beats_a_never_trained_one_by_a_clear_margin(loop) -> None:
    rec: LoopRecord = loop["rec"]
    assert rec.untrained is not None and rec.untrained.accept_length is not None
    untrained = rec.untrained.accept_length
    # the same prompts: the untrained draft is benched on round 1's held-out prompts
    assert rec.untrained.prompts == rec.rounds[0].bench.prompts
    for r in rec.rounds:
        assert r.bench.accept_length is not None
        assert r.bench.accept_length >= untrained + MARGIN, (r.round, r.bench.accept_length)
        assert "draft-not-used" not in r.bench.verdicts
        # the held-out loss fell from the untrained draft's (step 0)
        assert r.loss[0][0] == 0 and r.loss[-1][1] < r.loss[0][1]


def test_the_never_trained_draft_gets_draft_not_used(loop) -> None:
    rec: LoopRecord = loop["rec"]
    assert rec.untrained is not None
    assert "draft-not-used" in rec.untrained.verdicts
    report = read_report(rec.untrained.bench_json)
    [text] = [v.text for v in report.verdicts if v.code == "draft-not-used"]
    assert "Is the algorithm EAGLE instead of EAGLE3?" in text


def test_round_two_runs_with_round_ones_reweighted_limits(loop) -> None:
    rec: LoopRecord = loop["rec"]
    r1, r2 = rec.rounds
    overlay = Path(r1.reweight or "")
    limits = {k: v["limit"] for k, v in yaml.safe_load(overlay.read_text())["sources"].items()}
    assert r2.overlays == [str(overlay)] and r2.limits == limits
    # the limits are what round 2's run directory ran with
    manifest = yaml.safe_load((Path(r2.run_dir) / "manifest.yaml").read_text())
    assert {s["name"]: s.get("limit") for s in manifest["sources"] if s["name"] in limits} == limits
    # round 2 regenerated exactly that mix: each source up to its limit, never past its rows
    first, second = _planned(Path(r1.run_dir)), _planned(Path(r2.run_dir))
    assert {s: second[s] for s in limits} == {s: min(n, first[s]) for s, n in limits.items()}
    assert any(second[s] < first[s] for s in limits)  # the reweight moved the mix
    assert r2.rows_read < r1.rows_read


def _planned(run_dir: Path) -> dict[str, int]:
    """Samples per source in a run directory's plan."""
    plan = json.loads((run_dir / "plan.json").read_text())
    return {name: entry["total"] for name, entry in plan["sources"].items()}


def test_the_drafts_were_served_in_vllms_numbering(loop) -> None:
    rec: LoopRecord = loop["rec"]
    for r in rec.rounds:
        exported = json.loads((Path(r.draft) / "config.json").read_text())
        copy = json.loads((Path(r.draft_vllm) / "config.json").read_text())
        ids = exported["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        assert copy["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in ids]
        assert copy["regen_vllm_draft"]["source"] == str(Path(r.draft).resolve())


def test_the_summary_prints_both_rounds_side_by_side(loop) -> None:
    text = loop["stdout"]
    assert "the rounds side by side" in text
    for head in ("round 1", "round 2", "untrained", "acceptance length", "speedup at concurrency 1",
                 "held-out loss", "greedy answers identical", "sharegpt"):  # fmt: skip
        assert head in text, head
    # every command the loop ran is printed as typed
    for cmd in ("$ regen run", "$ regen serve-command", "$ regen verify-server", "$ regen bench",
                "$ regen plan", "specforge.export.to_sglang"):  # fmt: skip
        assert cmd in text, cmd
