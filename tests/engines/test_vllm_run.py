"""`regen run` against a real vLLM 0.32 server, end to end, on a real local Ray head.

- The demo manifest with streamed server ids through vLLM's Kimi parsers: every stored row's
  ``input_ids`` is exactly the prompt ids plus the output ids the server sent (read from the
  bytes a recording proxy saw, not from what regen made of them), and the local rebuild is
  compared and flagged (``token_check``).
- Overload (``--max-num-queued-reqs``): counted as overload, never as a failure; regen's
  count equals the server's own ``vllm:admission_rejections_total``.
- A prompt longer than the context: one permanent failure of that sample, nothing else.
- A SIGKILL of the driver mid-run, then the same command: nothing lost or stored twice,
  counted by (sample_id, turn), and the resumed rows are the server's ids too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _proxy import RecordingProxy

from regen.client.profiles.vllm import ADMISSION_REJECTIONS
from regen.client.server_load import counter_total, parse_metrics
from regen.devkit.procs import kill_group
from regen.engine import RunOptions, run_job
from regen.manifest import load_manifest, public_url
from regen.store import RunDir, layout
from regen.store.doneset import read_done
from regen.store.segments import read_journal_lines

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from _runs import DEMO, check_ids_once, inputs, stored_rows, wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.ray]

IM_END = 1011  # <|im_end|> in the demo tokenizer


def exact_rows(rows: list[dict[str, Any]], proxy: RecordingProxy) -> Counter[str]:
    """Assert every regenerated row is the server's own ids; returns its token_check counts."""
    sent: dict[str, list[tuple[list[int], list[int], str | None]]] = {}
    for ex in proxy.chat():
        ids = ex.ids()
        if ids is not None:
            key = json.dumps(ex.request["messages"], sort_keys=True, ensure_ascii=False)
            sent.setdefault(key, []).append(ids)
    checks: Counter[str] = Counter()
    for r in rows:
        if r["token_source"] == "native":
            continue
        assert (r["token_source"], r["engine"], r["engine_version"]) == ("server", "vllm",
                                                                          "0.32.0")  # fmt: skip
        key = json.dumps(json.loads(r["messages"]), sort_keys=True, ensure_ascii=False)
        answers = sent.get(key)
        assert answers, f"{r['sample_id']} turn {r['turn']}: no finished exchange recorded"
        want = [p + o + ([IM_END] if r["im_end_added"] else []) for p, o, _ in answers]
        assert r["input_ids"] in want, f"{r['sample_id']} turn {r['turn']}"
        # vLLM's finish chunk carries <|im_end|>: nothing to append
        assert not r["im_end_added"]
        assert r["loss_mask"] == [0] * len(answers[0][0]) + [1] * len(answers[0][1])
        assert r["token_check"] is not None
        checks[r["token_check"]] += 1
    return checks


@pytest.fixture(scope="module")
def demo_vllm(tmp_path_factory, vllm_server, ray_head) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("demo-vllm") / "run"
    with RecordingProxy(vllm_server.root) as proxy:
        manifest = load_manifest(DEMO, ["engine.workers=1"])  # the server runs 8 at once
        summary = run_job(manifest, RunDir.open(out, create=False),
                          RunOptions(endpoints=[proxy.url], address=ray_head.address))  # fmt: skip
        rows = stored_rows(out)
        return {"out": out, "proxy": proxy, "summary": summary, "rows": rows}


def test_every_row_is_vllms_own_ids(demo_vllm) -> None:
    s = demo_vllm["summary"]
    assert s.state == "finished" and s.done == s.total and s.failed_permanent == 0
    check_ids_once(demo_vllm["rows"], inputs(load_manifest(DEMO)))
    checks = exact_rows(demo_vllm["rows"], demo_vllm["proxy"])
    regenerated = sum(checks.values())
    assert regenerated >= 60
    # the local rebuild is compared with every row and its verdict recorded
    assert set(checks) <= {"match", "prompt_mismatch", "response_mismatch", "mismatch"}
    print(f"\nvLLM demo: {regenerated} rows, all vLLM's own ids; local rebuild {dict(checks)}")


def test_run_json_and_rows_name_the_engine(demo_vllm) -> None:
    info = layout.RUN_FILE.read(RunDir.open(demo_vllm["out"]))
    (rec,) = info.engines.values()
    assert (rec.engine, rec.version, rec.token_path) == ("vllm", "0.32.0", "vllm_stream")
    assert list(info.engines) == [public_url(demo_vllm["proxy"].url)]


def test_overload_is_counted_as_overload_never_as_a_failure(
    tmp_path, vllm_spec_server, ray_head
) -> None:
    import httpx2

    def rejections() -> float:
        text = httpx2.get(f"{vllm_spec_server.root}/metrics", timeout=10).text
        return counter_total(parse_metrics(text), ADMISSION_REJECTIONS) or 0.0

    before = rejections()
    # the overload path itself: without the server's page, whose readings keep its queue
    # short and a 503 rare (tests/engine/test_server_metrics.py)
    engine = ["engine.workers=1", "engine.concurrency=12", "engine.max_attempts=30",
              "engine.backoff_max_s=1.0", "engine.server_metrics=false"]  # fmt: skip
    manifest = load_manifest(DEMO, engine)
    out = tmp_path / "run"
    opts = RunOptions(endpoints=[vllm_spec_server.url], limit=24, address=ray_head.address)
    summary = run_job(manifest, RunDir.open(out, create=False), opts)
    refused = rejections() - before
    progress = RunDir.open(out).read_json("progress.json")
    overloaded = progress["errors"].get("overloaded", {}).get("count", 0)
    assert summary.state == "finished" and summary.done == summary.total == 24
    assert summary.failed_permanent == 0 and summary.failed_transient == 0
    assert not RunDir.open(out).list("failures") or all(
        not (out / "failures" / n).read_text().strip() for n in RunDir.open(out).list("failures")
    )
    assert refused > 0, "the run never met the queue limit"
    assert overloaded == refused  # every 503 the server sent, and nothing else, is overload
    assert set(progress["errors"]) == {"overloaded"}
    print(f"\nvLLM overload: {overloaded:.0f} overloads counted, server refused {refused:.0f}; "
          f"24/24 samples done, 0 failed")  # fmt: skip


def test_a_prompt_over_the_context_is_one_permanent_failure(tmp_path, vllm_server, ray_head):
    rows = [{"prompt_id": f"p{i}", "messages": [{"role": "user", "content": f"question {i}?"}]}
            for i in range(4)]  # fmt: skip
    rows.append({"prompt_id": "long", "messages": [{"role": "user", "content": "word " * 2500}]})
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "m.yaml").write_text(
        "name: too-long\ntarget: {model: demo-target, tokenizer: %s, template: kimi-k2.5}\n"
        "sampling: {max_tokens: 16, seed: 0}\n"
        "engine: {workers: 1, concurrency: 4, max_attempts: 3, backoff_initial_s: 0.1}\n"
        "sources:\n  - {name: chat, adapter: ultrachat, path: chat.jsonl, "
        "filters: {max_prompt_chars: 100000}}\n" % (DEMO.parent / "demo" / "tokenizer")
    )
    out = tmp_path / "run"
    opts = RunOptions(endpoints=[vllm_server.url], address=ray_head.address)
    summary = run_job(load_manifest(tmp_path / "m.yaml"), RunDir.open(out, create=False), opts)
    assert (summary.state, summary.done, summary.failed_permanent) == ("finished", 4, 1)
    rd = RunDir.open(out)
    failures = [json.loads(line) for n in rd.list("failures")
                for line in (out / "failures" / n).read_text().splitlines() if line]  # fmt: skip
    assert [(f["sample_id"].split("#")[0], f["status"], f["permanent"]) for f in failures] == [
        ("chat:long", 400, True)
    ]
    assert failures[0]["attempts"] == 1  # a 400 is never retried
    stored = {r["sample_id"].split("#")[0] for r in stored_rows(out)}
    assert stored == {f"chat:p{i}" for i in range(4)}


def test_sigkill_mid_run_then_resume_loses_and_repeats_nothing(
    tmp_path, vllm_server, ray_head, ray_env
) -> None:
    out = tmp_path / "run"
    overrides = ["engine.part_size=5", "sampling.max_tokens=96"]
    with RecordingProxy(vllm_server.root) as proxy:
        cmd = [str(Path(sys.executable).with_name("regen")), "--log-level", "WARNING", "run",
               str(DEMO), "--out", str(out), "--endpoint", proxy.url,
               "--address", ray_head.address, "--no-view"]  # fmt: skip
        for o in overrides:
            cmd += ["-o", o]
        log = (tmp_path / "run1.log").open("wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ray_env,
                                start_new_session=True)  # fmt: skip
        rd = RunDir.open(out)
        # the run cannot finish before the kill, however fast the server: 20 answers go
        # through, then one more at a time until a part and a journal line are both stored
        proxy.hold(after=20)

        def mid_run() -> bool:
            if proc.poll() is not None or not out.exists():
                return False
            parts, journal = read_done(rd).parts, len(read_journal_lines(rd))
            if parts >= 1 and journal >= 1:
                return True
            if proxy.waiting:
                proxy.allow(1)
            return False

        try:
            ok = wait_until(mid_run, timeout_s=300, step_s=0.5)
            assert ok, (tmp_path / "run1.log").read_text()[-3000:]
        finally:
            kill_group(proc, 30)  # SIGKILL of the driver's whole process group
            log.close()
            proxy.release()
        at_crash = read_done(rd).ids | {s.sample_id for s in read_journal_lines(rd)}
        run2 = subprocess.run(cmd, env=ray_env, capture_output=True, text=True, timeout=600)
        assert run2.returncode == 0, run2.stdout[-3000:] + run2.stderr[-3000:]
        rows = stored_rows(out)
        samples = inputs(load_manifest(DEMO, overrides))
        keys = Counter((r["sample_id"], r["turn"]) for r in rows)
        lost = {s.id for s in samples} - {r["sample_id"] for r in rows}
        duplicated = [k for k, n in keys.items() if n > 1]
        assert 0 < len(at_crash) < len(samples)
        assert (len(lost), len(duplicated)) == (0, 0)
        check_ids_once(rows, samples)
        exact_rows(rows, proxy)
        print(
            f"\nvLLM SIGKILL: {len(at_crash)} of {len(samples)} samples stored at the kill; "
            f"after resume {len(keys)} (sample_id, turn) rows, 0 lost, 0 duplicated"
        )
