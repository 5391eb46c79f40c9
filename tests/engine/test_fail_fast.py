"""Configuration errors stop `regen run` at once, before any actor starts (issue 13).

A missing tokenizer directory, a chat template that cannot render and a missing source file
each stop the real CLI within 10 s of its start with one line naming the manifest field and
the path, exit 2, no traceback, no run directory written, and no Ray actor created (counted on
the test's Ray head through the state API). Without the driver's checks, actors failing in
``__init__`` twice with the same error stop the run with that error (a configuration error,
not "rerun the command"), and their tracebacks stay out of the terminal.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _runs import DEMO, REPO, regen_cmd

pytestmark = pytest.mark.ray

#: the acceptance bound: seconds from the start of `regen run` to its exit
FAIL_WITHIN_S = 10.0
TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"


def worker_actors(dashboard_url: str) -> int:
    from ray.util.state import list_actors

    return len(list_actors(address=dashboard_url, filters=[("class_name", "=", "WorkerActor")],
                           limit=10_000, raise_on_missing_output=False))  # fmt: skip


def broken_template(tmp: Path) -> Path:
    tok = tmp / "tokenizer"
    shutil.copytree(TOKENIZER, tok)
    cfg = tok / "tokenizer_config.json"
    data = json.loads(cfg.read_text())
    data["chat_template"] = "{% for m in messages %}{{ m.content | no_such_filter }}{% endfor %}"
    cfg.write_text(json.dumps(data))
    return tok


CASES = {
    "tokenizer_missing": lambda tmp: (["-o", f"target.tokenizer={tmp / 'nowhere'}"],
                                      "target.tokenizer", str(tmp / "nowhere")),
    "template_fails": lambda tmp: (["-o", f"target.tokenizer={broken_template(tmp)}"],
                                   "target.tokenizer", str(tmp / "tokenizer")),
    "source_missing": lambda tmp: (["-o", "sources.3.path=demo/gone.jsonl"], "sources.3.path",
                                   str(DEMO.parent / "demo" / "gone.jsonl")),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_stops_within_10s_naming_field_and_path_before_any_actor(
    case, tmp_path, ray_head, ray_env
) -> None:
    overrides, field, path = CASES[case](tmp_path)
    out = tmp_path / "run"
    before = worker_actors(ray_head.dashboard_url)
    t0 = time.monotonic()
    p = subprocess.run(
        regen_cmd("run", str(DEMO), "--out", str(out), "--endpoint", "http://127.0.0.1:9/v1",
                  "--address", ray_head.address, "--no-view", *overrides),
        env=ray_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    took = time.monotonic() - t0
    assert p.returncode == 2, p.stderr
    assert took < FAIL_WITHIN_S, f"{case}: stopped after {took:.1f} s"
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert field in lines[0] and path in lines[0], lines[0]
    assert "Traceback" not in p.stdout + p.stderr
    assert not out.exists()  # nothing written
    assert worker_actors(ray_head.dashboard_url) == before  # no actor was created


INIT_FAILS = """
import logging, sys
from regen.cli.main import invoke
from regen.engine import RunOptions, run_job
from regen.manifest import load_manifest
from regen.simulate.testing import simulator_in_thread
from regen.store import RunDir

def go(args):
    m = load_manifest(sys.argv[1], ["engine.workers=1"])
    # one regenerated source: the driver itself never loads the tokenizer, the actors do
    m = m.model_copy(update={"sources": m.sources[:1],
                             "target": m.target.model_copy(update={"tokenizer": sys.argv[3]})})
    with simulator_in_thread(model_name="demo-target", instant=True) as sim:
        rd = RunDir.open(sys.argv[2], create=False)
        run_job(m, rd, RunOptions(endpoints=[sim.url], address=sys.argv[4], preflight=False,
                                  handle_signals=False))

class A: log_level = "WARNING"
sys.exit(invoke(go, A))
"""


def test_actors_failing_to_start_twice_is_a_configuration_error(
    tmp_path, ray_head, ray_env
) -> None:
    missing = tmp_path / "nowhere"
    p = subprocess.run(
        [sys.executable, "-c", INIT_FAILS, str(DEMO), str(tmp_path / "run"), str(missing),
         ray_head.address],
        env=ray_env, capture_output=True, text=True, timeout=240, cwd=REPO,
    )  # fmt: skip
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    assert "workers cannot start" in p.stderr and str(missing) in p.stderr
    assert "rerun the command" not in p.stderr
    assert "Traceback" not in p.stdout + p.stderr  # actor tracebacks stay in Ray's logs
