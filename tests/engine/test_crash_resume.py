"""Crash and resume against the simulator on a real local Ray head (issue 4 acceptance).

A `regen run` subprocess (own process group) is SIGKILLed once parts and journal lines exist,
then the same command runs to completion. The data must be exactly the input: ids equal, no
duplicate (sample_id, turn), every answer byte-for-byte the simulator's, and only samples that
were not stored at the crash are requested again (measured by the simulator's per-conversation
request counts).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _runs import check_answers, check_ids_once, stored_rows, wait_until

from regen.cli.main import main as regen_main
from regen.core.errors import FingerprintMismatchError, LockHeldError
from regen.devkit.procs import kill_group
from regen.devkit.simulate import conversation_key
from regen.devkit.simulate.testing import running_simulator
from regen.engine import RunOptions, run_job
from regen.manifest import load_manifest
from regen.plan.index import native_check as _native_check
from regen.sources import read_samples, source_set
from regen.store import RunDir, layout
from regen.store.doneset import read_done
from regen.store.layout import LOCK as LOCK_FILE
from regen.store.segments import read_journal_lines

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "manifests" / "demo.yaml"
OVERRIDES = ["engine.part_size=5"]
#: a slow server: 4 batch slots, 5 ms per step → a run lasts long enough to be killed mid-way
SIM = {"model_name": "demo-target", "max_running_requests": 4, "step_ms": 5.0,
       "mean_tokens": 30.0}  # fmt: skip
KILL_AFTER_SAMPLES = 12


def row_conversation(row: dict[str, Any]) -> str:
    tools = json.loads(row["tools"]) if row["tools"] else None
    return conversation_key({"messages": json.loads(row["messages"]), "tools": tools})


def wait_quiet(sim, timeout_s: float = 30.0, quiet_s: float = 1.5) -> None:
    """Until the simulator has nothing running and received nothing new for ``quiet_s``."""
    deadline = time.monotonic() + timeout_s
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        st = sim.stats()
        cur = (st["received"], st["running"], st["queued"])
        if cur != last:
            last, since = cur, time.monotonic()
        elif st["running"] == 0 and st["queued"] == 0 and time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.1)
    raise AssertionError(f"simulator did not go quiet: {last}")


def regen_run_cmd(out: Path, url: str, address: str, *extra: str) -> list[str]:
    exe = Path(sys.executable).with_name("regen")
    args = [str(exe), "--log-level", "WARNING", "run", str(DEMO), "--out", str(out),
            "--endpoint", url, "--address", address, "--no-view"]  # fmt: skip
    for o in OVERRIDES:
        args += ["-o", o]
    return args + list(extra)


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    with running_simulator(**SIM) as s:
        yield s


@pytest.fixture(scope="module")
def crashed(tmp_path_factory, sim, ray_head, ray_env) -> dict[str, Any]:
    """Run, SIGKILL mid-run, rerun to completion; returns what the tests assert on."""
    out = tmp_path_factory.mktemp("crash") / "run"
    cmd = regen_run_cmd(out, sim.url, ray_head.address)
    log1 = (out.parent / "run1.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log1, stderr=subprocess.STDOUT, env=ray_env,
                            start_new_session=True)  # fmt: skip
    rd = RunDir.open(out)

    def stored() -> int:
        if not out.exists():
            return 0
        return len(read_done(rd)) + len(read_journal_lines(rd))

    try:
        # kill with a part written AND an unfinished journal segment (samples complete in
        # bursts that fill a part at once, so the journal is sometimes empty)
        ok = wait_until(lambda: proc.poll() is None and stored() >= KILL_AFTER_SAMPLES
                        and read_done(rd).parts >= 1 and len(read_journal_lines(rd)) >= 1,
                        timeout_s=120)  # fmt: skip
        assert ok, (out.parent / "run1.log").read_text()[-3000:]
    finally:
        kill_group(proc, 30)
        log1.close()
    wait_quiet(sim)
    done_at_crash = read_done(rd).ids | {s.sample_id for s in read_journal_lines(rd)}
    journal_left = len(rd.list("journal"))
    before = Counter(sim.stats(keys=True)["conversations"])

    run2 = subprocess.run(cmd, env=ray_env, capture_output=True, text=True, timeout=240)
    assert run2.returncode == 0, run2.stdout[-3000:] + run2.stderr[-3000:]
    after = Counter(sim.stats(keys=True)["conversations"])
    manifest = load_manifest(DEMO, OVERRIDES)
    inputs = list(read_samples(sources := source_set(manifest), None, _native_check(sources)))
    return {
        "out": out,
        "rd": rd,
        "manifest": manifest,
        "inputs": inputs,
        "done_at_crash": done_at_crash,
        "journal_left": journal_left,
        "requested_after": {k for k in after if after[k] > before.get(k, 0)},
        "rows": stored_rows(out),
    }


def test_crash_left_a_partial_run(crashed) -> None:
    assert len(crashed["done_at_crash"]) >= KILL_AFTER_SAMPLES
    assert len(crashed["done_at_crash"]) < len(crashed["inputs"])
    assert crashed["journal_left"] >= 1  # the killed session's journal was recovered
    assert crashed["rd"].list("journal") == []
    assert not crashed["rd"].exists(LOCK_FILE)
    # the resumed session's actors loaded the tokenizer by the class the first one resolved
    # (regen.template.tokenizer): the rows below are theirs
    checks = layout.CHECKS_FILE.read(crashed["rd"])
    assert checks is not None
    assert checks.tokenizer_class == "transformers.tokenization_utils_tokenizers:TokenizersBackend"


def test_output_ids_equal_input_ids_without_duplicates(crashed) -> None:
    check_ids_once(crashed["rows"], crashed["inputs"])


def test_every_answer_is_the_simulators_byte_for_byte(crashed) -> None:
    assert check_answers(crashed["rows"], crashed["manifest"], SIM) >= 60


def test_only_samples_not_stored_at_the_crash_were_requested_again(crashed) -> None:
    conv: dict[str, set[str]] = {}
    for r in crashed["rows"]:
        if r["token_source"] != "native":
            conv.setdefault(r["sample_id"], set()).add(row_conversation(r))
    owners = Counter(k for ks in conv.values() for k in ks)
    done = crashed["done_at_crash"]
    unique = {sid: next(iter(ks)) for sid, ks in conv.items() if owners[next(iter(ks))] == 1}
    stored_keys = {k for sid, k in unique.items() if sid in done}
    missing_keys = {k for sid, k in unique.items() if sid not in done}
    assert stored_keys and missing_keys
    requested = crashed["requested_after"]
    assert requested & stored_keys == set()  # nothing stored was asked for again
    assert missing_keys <= requested  # everything not stored was


def test_resume_of_a_finished_run_requests_nothing(crashed, sim, ray_head) -> None:
    before = sim.stats()["received"]
    summary = run_job(crashed["manifest"], RunDir.open(crashed["out"], create=False),
                      RunOptions(endpoints=[sim.url], address=ray_head.address))  # fmt: skip
    assert summary.state == "finished"
    assert summary.completed_now == 0
    assert summary.done == summary.total == len(crashed["inputs"])
    assert sim.stats()["received"] == before
    progress = crashed["rd"].read_json("progress.json")
    assert progress["state"] == "finished"
    assert sum(s["done"] for s in progress["sources"].values()) == len(crashed["inputs"])


def test_fingerprint_mismatch_refused_unless_forced(crashed, sim, tmp_path, capsys) -> None:
    out = tmp_path / "copy"
    shutil.copytree(crashed["out"], out)
    other = load_manifest(DEMO, [*OVERRIDES, "sampling.temperature=0.1"])
    with pytest.raises(FingerprintMismatchError):
        run_job(other, RunDir.open(out, create=False), RunOptions(endpoints=[sim.url]))
    rc = regen_main(["run", str(DEMO), "--out", str(out), "--endpoint", sim.url, "--no-view",
                     "-o", "sampling.temperature=0.1"])  # fmt: skip
    assert rc == 2
    assert "different manifest" in " ".join(capsys.readouterr().err.split())
    summary = run_job(
        other, RunDir.open(out, create=False), RunOptions(endpoints=[sim.url], force=True)
    )
    assert summary.state == "finished" and summary.completed_now == 0
    assert RunDir.open(out).read_json("run.json")["fingerprint"] == other.fingerprint()


def test_live_lock_refused(crashed, sim, tmp_path, capsys) -> None:
    out = tmp_path / "copy"
    shutil.copytree(crashed["out"], out)
    now = time.time()
    RunDir.open(out).write_json_atomic(
        LOCK_FILE,
        {"owner": "regen run", "host": __import__("socket").gethostname(), "pid": os.getpid(),
         "session": "other", "started_at": now, "heartbeat_at": now},
    )  # fmt: skip
    with pytest.raises(LockHeldError):
        run_job(
            crashed["manifest"], RunDir.open(out, create=False), RunOptions(endpoints=[sim.url])
        )
    rc = regen_main(["run", str(DEMO), "--out", str(out), "--endpoint", sim.url, "--no-view"])
    assert rc == 2
    assert "locked by a live run" in " ".join(capsys.readouterr().err.split())
