"""Quality end to end against the real simulator on a real local Ray head (issue 15 acceptance).

The simulator answers 10% of requests with a degenerate answer (``--degenerate-rate 0.1``:
loops to max_tokens, empty content after reasoning, another script) and returns token ids
(``--tokenizer``: the rows are the server's ids, ``</think>`` read from them). The manifest is
the demo plus a generated source of 360 single-turn English prompts (enough answers for a rate
to mean something). The test measures, over every stored turn, the share of degenerate answers
flagged (>= 95%) and of normal answers flagged (< 1%), exports (the flagged rows dropped and
counted in stats.json), then runs `regen run --retry-flagged all` as a subprocess, SIGKILLs it
once new attempts are stored in a part and in the journal, and reruns the same command: every
flagged sample then has exactly one new attempt, byte-for-byte the simulator's answer to the new
seed, nothing stored before was rewritten, and the export holds the new attempts instead.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from _runs import (
    check_answers,
    check_ids_once,
    read_numbers,
    regen_cmd,
    request_body,
    stored_rows,
    wait_until,
)

from regen.core.result import LOOP
from regen.devkit.procs import kill_group
from regen.devkit.simulate.answer import degenerate_kind
from regen.devkit.simulate.testing import running_simulator
from regen.export import ExportSettings, export_run
from regen.manifest import load_manifest
from regen.plan.index import native_check
from regen.quality import DEFAULT_DROP_FLAGS
from regen.sources import read_samples, source_set
from regen.store import RunDir, layout
from regen.store.doneset import read_done
from regen.store.segments import read_journal_lines
from regen.store.verify import verify_run

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "manifests" / "demo.yaml"
TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"
RATE = 0.1
#: a slow-enough server (the retry must be killable mid-way) whose normal answers never reach
#: max_tokens (mean 40, sigma 0.5 against 256): only the loops do
SIM = {
    "model_name": "demo-target",
    "max_running_requests": 8,
    "step_ms": 4.0,
    "mean_tokens": 40.0,
    "length_sigma": 0.5,
    "degenerate_rate": RATE,
    "tokenizer": str(TOKENIZER),
}
#: the loop cut looks often and cuts at 100 words: the simulator's loops of this test end at
#: max_tokens 256, before the default cut (200 words, a look per 128 tokens) would see them
OVERRIDES = [
    "sampling.max_tokens=256",
    "quality.loop_cut.every=16",
    "quality.loop_cut.window_words=200",
    "quality.loop_cut.min_words=100",
    "engine.part_size=6",
    "engine.part_interval_s=2",
    "engine.workers=1",
    "engine.concurrency=8",
]
GENERATED = 360
TOPICS = [
    "prefix caching",
    "speculative decoding",
    "a heat pump",
    "tidal power",
    "bread dough",
    "a bicycle gear",
    "the immune system",
    "compound interest",
    "a binary heap",
    "river deltas",
    "jet streams",
    "vaccines",
    "photosynthesis",
    "a hash table",
    "the printing press",
    "glaciers",
    "a suspension bridge",
    "coral reefs",
]
ASKS = [
    "Explain how {} works to a curious teenager",
    "What are the main trade-offs of {}",
    "Write three short tips about {} for a beginner",
    "Compare {} with an older approach",
    "Describe a common mistake people make with {} and how to avoid it",
    "Summarise the history of {} in a few sentences",
]


def generated_source(path: Path) -> None:
    """Single-turn English prompts, distinct enough for near-duplicate detection."""
    rng = random.Random(15)
    words = [
        "carefully",
        "briefly",
        "with an example",
        "step by step",
        "in plain words",
        "for a report",
        "for my class",
        "with numbers",
        "as a list",
        "honestly",
    ]
    with path.open("w") as f:
        for i in range(GENERATED):
            text = (
                rng.choice(ASKS).format(rng.choice(TOPICS))
                + ", "
                + " and ".join(rng.sample(words, 3))
                + f" (question {i}, case {rng.random():.6f})."
            )
            msgs = [{"role": "user", "content": text}]
            f.write(json.dumps({"prompt": text, "prompt_id": f"g{i:04d}", "messages": msgs}) + "\n")


def write_manifest(tmp: Path) -> Path:
    data = yaml.safe_load(DEMO.read_text())
    base = DEMO.parent
    data["target"]["tokenizer"] = str(base / data["target"]["tokenizer"])
    for s in data["sources"]:
        s["path"] = str(base / s["path"])
    generated_source(tmp / "generated.jsonl")
    data["sources"].insert(
        0,
        {
            "name": "generated",
            "adapter": "ultrachat",
            "path": str(tmp / "generated.jsonl"),
            "output_tokens": [24, 48],
        },
    )
    path = tmp / "manifest.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_cmd(manifest: Path, out: Path, url: str, address: str, *extra: str) -> list[str]:
    args = [
        "run",
        str(manifest),
        "--out",
        str(out),
        "--endpoint",
        url,
        "--address",
        address,
        "--no-view",
    ]
    for o in OVERRIDES:
        args += ["-o", o]
    return regen_cmd(*args, *extra)


def part_digests(root: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((root / "parts").glob("*.parquet"))
    }


@pytest.fixture(scope="module")
def e2e(tmp_path_factory, ray_head, ray_env) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("quality")
    manifest_path = write_manifest(tmp)
    manifest = load_manifest(manifest_path, OVERRIDES)
    out = tmp / "run"
    with running_simulator(**SIM) as sim:
        first = subprocess.run(
            run_cmd(manifest_path, out, sim.url, ray_head.address),
            env=ray_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        rows_first = stored_rows(out)
        status_first = read_numbers(out)
        export_first = export_run(
            RunDir.open(out, create=False), str(tmp / "export1"), ExportSettings.build(shard_rows=0)
        )
        parts_first = part_digests(out)

        # two requests in flight: the retry lasts long enough to be killed mid-way
        retry = run_cmd(
            manifest_path,
            out,
            sim.url,
            ray_head.address,
            "--retry-flagged",
            "all",
            "--concurrency",
            "2",
        )
        log = (tmp / "retry1.log").open("wb")
        proc = subprocess.Popen(
            retry, stdout=log, stderr=subprocess.STDOUT, env=ray_env, start_new_session=True
        )
        rd = RunDir.open(out)

        def retries_in_part_and_journal() -> bool:
            if proc.poll() is not None:
                return True
            new_parts = set(part_digests(out)) - set(parts_first)  # only retries are left
            return bool(new_parts) and bool(read_journal_lines(rd))

        try:
            assert wait_until(retries_in_part_and_journal, timeout_s=180, step_s=0.1)
            killed_mid_way = proc.poll() is None
        finally:
            kill_group(proc, 30)
            log.close()
        at_kill = read_done(rd)
        second = subprocess.run(retry, env=ray_env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        again = subprocess.run(retry, env=ray_env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    return {
        "out": out,
        "tmp": tmp,
        "manifest": manifest,
        "rows_first": rows_first,
        "status_first": status_first,
        "export_first": export_first,
        "parts_first": parts_first,
        "killed_mid_way": killed_mid_way,
        "attempts_at_kill": dict(at_kill.attempts),
        "again_out": again.stdout,
        "rows": stored_rows(out),
        "inputs": list(read_samples(sources := source_set(manifest), None, native_check(sources))),
    }


def measure(rows: list[dict[str, Any]], manifest: Any) -> dict[str, Any]:
    """Per stored regenerated turn: was the simulator's answer degenerate, was it flagged."""
    degenerate = Counter()
    caught = Counter()
    normal = flagged_normal = 0
    false_flags: list[tuple[str, list[str]]] = []
    for r in rows:
        if r["token_source"] == "native":
            continue
        kind = degenerate_kind(request_body(r, manifest), RATE)
        if kind is None:
            normal += 1
            if r["quality_flags"]:
                flagged_normal += 1
                false_flags.append((r["sample_id"], r["quality_flags"]))
        else:
            degenerate[kind] += 1
            caught[kind] += bool(r["quality_flags"])
    n_deg = sum(degenerate.values())
    return {
        "normal": normal,
        "false": flagged_normal,
        "false_flags": false_flags,
        "degenerate": dict(degenerate),
        "caught": dict(caught),
        "n_degenerate": n_deg,
        "catch_rate": sum(caught.values()) / n_deg if n_deg else 0.0,
        "false_rate": flagged_normal / normal if normal else 0.0,
    }


def test_degenerate_answers_are_flagged_and_normal_ones_are_not(e2e) -> None:
    m = measure(e2e["rows_first"], e2e["manifest"])
    print(
        f"\nquality e2e (first answers): {m['n_degenerate']} degenerate turns "
        f"{m['degenerate']}, flagged {m['caught']} = {m['catch_rate']:.1%}; "
        f"{m['false']} of {m['normal']} normal turns flagged = {m['false_rate']:.2%}"
    )
    assert m["n_degenerate"] >= 30 and m["normal"] >= 350
    assert m["catch_rate"] >= 0.95, m
    assert m["false_rate"] < 0.01, m["false_flags"]
    assert check_answers(e2e["rows_first"], e2e["manifest"], SIM) >= 380
    # the rows are the server's ids, and </think> was read from them; a loop cut while it
    # streamed never got SGLang's ids (they come in the last chunk): it is rendered here
    rows = e2e["rows_first"]
    assert {r["token_source"] for r in rows if r["finish_reason"] != LOOP} == {"server", "native"}
    assert {r["token_source"] for r in rows if r["finish_reason"] == LOOP} <= {"local"}


def test_loops_long_enough_for_the_window_are_cut_while_they_stream(e2e) -> None:
    """The loops are cut as they stream (a look per 16 tokens, 100 words: OVERRIDES), each cut
    answer a loop of the simulator's; a loop whose opening leaves it too little room before
    max_tokens runs to it and is flagged afterwards."""
    rows = [r for r in e2e["rows_first"] if r["token_source"] != "native"]
    cut = [r for r in rows if r["finish_reason"] == LOOP]
    loops = [r for r in rows if degenerate_kind(request_body(r, e2e["manifest"]), RATE) == "loop"]
    assert cut and {r["sample_id"] for r in cut} <= {r["sample_id"] for r in loops}
    for r in cut:
        assert "repetition" in r["quality_flags"] and not r["truncated"]
        assert r["cut_saved"] == 256 - r["completion_tokens"] > 0
    n = e2e["status_first"]
    assert n.overall.loop_cut == len(cut)
    assert n.overall.cut_saved == sum(r["cut_saved"] for r in cut)


def test_status_shows_the_flagged_counts_of_the_parts(e2e) -> None:
    flagged: Counter[str] = Counter()
    by_flag: Counter[str] = Counter()
    for r in e2e["rows_first"]:
        by_flag.update(r["quality_flags"])
    for sid in {r["sample_id"] for r in e2e["rows_first"] if r["quality_flags"]}:
        flagged[sid.split(":", 1)[0]] += 1
    n = e2e["status_first"]
    assert n.overall.flagged == sum(flagged.values()) > 0
    assert {s.name: s.flagged for s in n.sources if s.flagged} == dict(flagged)
    assert n.overall.flags == dict(sorted(by_flag.items(), key=lambda kv: (-kv[1], kv[0])))


def test_export_drops_the_flagged_rows_and_counts_them(e2e) -> None:
    stats = e2e["export_first"]
    rows = [r for r in e2e["rows_first"] if r["token_source"] != "native"]
    dropped = [r for r in rows if set(r["quality_flags"]) & set(DEFAULT_DROP_FLAGS)]
    assert stats.dropped["flagged"] == len(dropped) > 0
    saved = json.loads((e2e["tmp"] / "export1" / "stats.json").read_text())
    per_flag: dict[str, dict[str, int]] = {}
    for r in dropped:
        for f in r["quality_flags"]:
            d = per_flag.setdefault(f, {"rows": 0, "tokens": 0, "loss_tokens": 0})
            d["rows"] += 1
            d["tokens"] += r["num_tokens"]
            d["loss_tokens"] += r["loss_tokens"]
    assert saved["flags"] == per_flag
    assert sum(s["dropped"].get("flagged", 0) for s in saved["sources"].values()) == len(dropped)


def test_the_crash_in_the_retry_lost_nothing(e2e) -> None:
    assert e2e["killed_mid_way"], "the retry finished before it could be killed"
    first = {r["sample_id"] for r in e2e["rows_first"] if r["quality_flags"]}
    assert 0 < len(e2e["attempts_at_kill"]) < len(first)
    rows = e2e["rows"]
    check_ids_once(rows, e2e["inputs"])  # no (sample_id, turn, attempt) twice, no gaps
    attempts = Counter()
    for sid, a in {(r["sample_id"], r["attempt"]) for r in rows}:
        attempts[sid] = max(attempts[sid], a)
    assert {sid for sid, a in attempts.items() if a} == first  # every flagged one, once
    assert max(attempts.values()) == 1  # the rerun after the crash and the third run added none
    assert check_answers(rows, e2e["manifest"], SIM) == sum(
        r["token_source"] != "native" for r in rows
    )  # new attempts are the simulator's answers to the new seed
    # nothing stored before was rewritten
    now = part_digests(e2e["out"])
    assert {k: now[k] for k in e2e["parts_first"]} == e2e["parts_first"]
    assert "(0 this session)" in e2e["again_out"]  # the same command once more: nothing to do
    rep = verify_run(RunDir.open(e2e["out"]))
    assert rep.clean, [p.line() for p in rep.problems]


def test_the_export_holds_the_new_attempts(e2e, tmp_path) -> None:
    stats = export_run(
        RunDir.open(e2e["out"], create=False),
        str(tmp_path / "o"),
        ExportSettings.build(shard_rows=0, format="conversations"),
    )
    rows = e2e["rows"]
    latest = {}
    for r in rows:
        latest[r["sample_id"]] = max(latest.get(r["sample_id"], 0), r["attempt"])
    old = [r for r in rows if r["attempt"] < latest[r["sample_id"]]]
    assert stats.dropped["superseded"] == len(old) > 0
    recs = {
        json.loads(x)["id"]: json.loads(x)
        for f in sorted((tmp_path / "o").glob("*.jsonl"))
        for x in f.read_text().splitlines()
    }
    for sid in {r["sample_id"] for r in old}:
        new = [r for r in rows if r["sample_id"] == sid and r["attempt"] == 1]
        if set().union(*(r["quality_flags"] for r in new)) & set(DEFAULT_DROP_FLAGS):
            continue  # flagged again: dropped from this export too
        top = max(new, key=lambda r: r["turn"])
        assert recs[sid]["conversations"][-1]["content"] == top["content"]
    again = measure([r for r in rows if r["attempt"] == 1], e2e["manifest"])
    print(
        f"\nnew attempts: {again['n_degenerate']} of {again['n_degenerate'] + again['normal']} "
        f"degenerate again"
    )
    n = read_numbers(e2e["out"])
    assert n.overall.retried == len({r["sample_id"] for r in old}) and n.overall.retrying == 0
    assert n.overall.flagged == len(
        {
            sid
            for sid, a in latest.items()
            if any(r["quality_flags"] for r in rows if r["sample_id"] == sid and r["attempt"] == a)
        }
    )
    assert layout.PROGRESS_FILE.read(RunDir.open(e2e["out"])).state == "finished"
