"""Configuration errors stop `regen run` at once, before any actor starts (issue 13).

A missing tokenizer directory, a chat template that cannot render and a missing source file
each stop the real CLI before anything slow starts: one line naming the manifest field and
the path, exit 2, no traceback, no run directory written, not one connection to the endpoint
(whose check comes before Ray: a listener counts them) and no Ray actor created (counted on
the test's Ray head through the state API). Decided by those events, not by a clock. Without
the driver's checks, actors failing in ``__init__`` twice with the same error stop the run
with that error (a configuration error, not "rerun the command"), and their tracebacks stay
out of the terminal.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from _runs import DEMO, REPO, regen_cmd

pytestmark = [pytest.mark.ray, pytest.mark.ray_dashboard]  # the state API counts actors

TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"


def worker_actors(dashboard_url: str) -> int:
    from ray.util.state import list_actors

    return len(list_actors(address=dashboard_url, filters=[("class_name", "=", "WorkerActor")],
                           limit=10_000, raise_on_missing_output=False))  # fmt: skip


@contextlib.contextmanager
def counting_listener() -> Iterator[tuple[str, list[int]]]:
    """A loopback TCP port that accepts and counts connections (and closes them)."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)
    count = [0]
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            count[0] += 1
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}/v1", count
    finally:
        done.set()
        thread.join(timeout=5)
        srv.close()


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
def test_stops_naming_field_and_path_before_any_request_or_actor(
    case, tmp_path, ray_head, ray_env
) -> None:
    overrides, field, path = CASES[case](tmp_path)
    out = tmp_path / "run"
    before = worker_actors(ray_head.dashboard_url)
    with counting_listener() as (endpoint, connections):
        p = subprocess.run(
            regen_cmd("run", str(DEMO), "--out", str(out), "--endpoint", endpoint,
                      "--address", ray_head.address, "--no-view", *overrides),
            env=ray_env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert connections == [0]  # the endpoint check (which comes before Ray) never ran
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
from regen.devkit.simulate.testing import simulator_in_thread
from regen.store import RunDir

# the in-thread simulator logs a client that went away before its headers (an actor killed
# mid-request, likelier on a busy machine) with aiohttp's traceback: the server's noise, not
# the run's output this test judges
logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)

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
