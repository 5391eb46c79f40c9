"""A whole run on a real S3 API: moto's server on loopback, the run directory
``s3://BUCKET/runs/demo?endpoint_override=...&scheme=http``, the simulator, a local Ray head.

One `regen run` subprocess works on the S3 run directory. While it runs: a second `regen run`
on the same prefix is refused (the lock, on conditional writes), and `regen status --json` /
`regen monitor --once` read the URI from other processes. It is SIGKILLed (process group)
just before its next part is due, which is the worst case on an object store (no journal:
nothing completed since the last part is durable); the loss is measured and must stay within
``engine.part_interval_s`` plus the loop's own latency. The same command then finishes the
run; the crash checks pass (ids equal the input, no duplicate (sample_id, turn), every answer
byte-for-byte the simulator's), `regen verify` is clean and `regen export` reads from S3.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from _runs import DEMO, check_answers, check_ids_once, inputs, regen_cmd, stored_rows
from _s3 import moto_s3

from regen.devkit.procs import kill_group
from regen.devkit.simulate.testing import running_simulator
from regen.manifest import load_manifest
from regen.store import RunDir, layout
from regen.store.doneset import read_done

pytestmark = pytest.mark.ray

#: seconds between parts (what bounds the loss on an object store) and samples per part
PART_INTERVAL_S = 2.0
OVERRIDES = ["engine.part_size=1000", f"engine.part_interval_s={PART_INTERVAL_S}"]
#: a slow server: 2 batch slots, 40 ms per step, so the run lasts long enough (~60 s) to be
#: watched from other processes and killed
SIM = {"model_name": "demo-target", "max_running_requests": 2, "step_ms": 40.0,
       "mean_tokens": 30.0}  # fmt: skip
#: the rerun's server: the same answers (capacity is not part of an answer), at once
FAST = {"instant": True, "max_running_requests": 64}
#: parts the run must have written before it is killed
PARTS_BEFORE_KILL = 2
#: how long before its next part is due the driver is killed
KILL_BEFORE_DUE_S = 0.25


def run_cmd(uri: str, url: str, address: str) -> list[str]:
    args = regen_cmd("run", str(DEMO), "--out", uri, "--endpoint", url, "--address", address,
                     "--no-view")  # fmt: skip
    for o in OVERRIDES:
        args += ["-o", o]
    return args


def part_keys(s3, bucket: str) -> list[str]:
    return sorted(k for k in s3.keys(bucket, "runs/demo/parts/") if k.endswith(".parquet")
                  and not k.rsplit("/", 1)[-1].startswith(".tmp-"))  # fmt: skip


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as s:
        yield s


@pytest.fixture(scope="module")
def run(s3, ray_head, ray_env, tmp_path_factory) -> dict[str, Any]:
    """Run on S3, check what other processes see, SIGKILL, rerun; what the tests assert on."""
    bucket = s3.bucket()
    uri = s3.uri(bucket, "runs/demo")
    env = s3.env(ray_env)
    got: dict[str, Any] = {"uri": uri, "bucket": bucket, "env": env}
    tmp = tmp_path_factory.mktemp("s3run")
    with running_simulator(**SIM) as sim:
        log = (tmp / "run1.log").open("wb")
        cmd = run_cmd(uri, sim.url, ray_head.address)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
        rd = RunDir.open(uri, create=False)
        try:
            seen: dict[str, float] = {}  # part key -> when it was first listed
            deadline = time.monotonic() + 180
            while len(seen) < PARTS_BEFORE_KILL and time.monotonic() < deadline:
                assert proc.poll() is None, (tmp / "run1.log").read_text()[-3000:]
                for k in part_keys(s3, bucket):
                    seen.setdefault(k, time.time())
                time.sleep(0.05)
            assert len(seen) >= PARTS_BEFORE_KILL, (tmp / "run1.log").read_text()[-3000:]

            # while it runs: a second driver is refused; status and monitor read the URI
            others = {
                "second": run_cmd(uri, sim.url, ray_head.address),
                "status": regen_cmd("status", uri, "--json"),
                "monitor": regen_cmd("monitor", uri, "--once", "--width", "120"),
            }
            procs = {k: subprocess.Popen(a, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True)
                     for k, a in others.items()}  # fmt: skip
            for k, p in procs.items():
                out, err = p.communicate(timeout=120)
                got[k] = subprocess.CompletedProcess(p.args, p.returncode, out, err)
            assert proc.poll() is None, "the run ended while other processes read it"

            # kill just before the next part is due: the worst case
            while True:
                for k in part_keys(s3, bucket):
                    seen.setdefault(k, time.time())
                last = max(seen.values())
                due = last + PART_INTERVAL_S - KILL_BEFORE_DUE_S
                if time.time() >= due:
                    break
                snap = layout.PROGRESS_FILE.read(rd)
                time.sleep(0.05)
            assert proc.poll() is None, "the run ended before it could be killed"
            snap = layout.PROGRESS_FILE.read(rd)  # the last counters it published
            kill_group(proc, 30)
            killed_at = time.time()
        finally:
            kill_group(proc, 30)
            log.close()
        done = read_done(rd)
        got["window_s"] = killed_at - max(seen.values())
        times = sorted(seen.values())
        got["pace_s"] = max(b - a for a, b in itertools.pairwise(times))
        got["published_done"] = snap.overall.done if snap else 0
        got["stored_at_kill"] = len(done)
        got["lost"] = max(0, got["published_done"] - len(done))
        got["parts_at_kill"] = done.parts

    # the same command finishes the run; a fast server with the same answers saves time
    with running_simulator(**{**SIM, **FAST}) as fast:
        rerun = run_cmd(uri, fast.url, ray_head.address)
        got["rerun"] = subprocess.run(rerun, env=env, capture_output=True, text=True, timeout=300)
    got["rows"] = stored_rows(uri)
    got["manifest"] = load_manifest(DEMO, OVERRIDES)
    got["inputs"] = inputs(got["manifest"])
    print(f"\nS3 SIGKILL just before a part was due (part_interval_s={PART_INTERVAL_S}): "
          f"{got['window_s']:.2f} s since the last part, {got['lost']} completed samples "
          f"lost (published done {got['published_done']}, stored {got['stored_at_kill']}, "
          f"{got['parts_at_kill']} parts)")  # fmt: skip
    return got


def test_second_driver_is_refused_while_the_first_lives(run) -> None:
    p = run["second"]
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    assert "locked by a live run" in " ".join(p.stderr.split())
    assert "Traceback" not in p.stdout + p.stderr


def test_status_and_monitor_from_another_process(run) -> None:
    st = run["status"]
    assert st.returncode == 0, st.stderr
    n = json.loads(st.stdout)
    assert n["state"] in ("running", "starting") and n["done"] > 0 and n["damaged"] == []
    assert n["holder"]["alive"]
    mon = run["monitor"]
    assert mon.returncode == 0, mon.stderr
    assert "RUNNING" in mon.stdout and "TOTAL" in mon.stdout


def test_the_loss_of_a_sigkill_is_bounded_by_part_interval(run) -> None:
    assert run["parts_at_kill"] >= PARTS_BEFORE_KILL
    # the kill came before the next part was due, as this run paced its parts (a busy machine
    # writes them later, and the test's own loop is slower too: a ratio, not a fixed budget)
    assert run["window_s"] <= 1.5 * max(run["pace_s"], PART_INTERVAL_S)
    assert run["stored_at_kill"] < len(run["inputs"])


def test_resume_on_s3_passes_the_crash_checks(run) -> None:
    p = run["rerun"]
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "Traceback" not in p.stdout + p.stderr
    check_ids_once(run["rows"], run["inputs"])
    assert check_answers(run["rows"], run["manifest"], SIM) >= 60
    v = subprocess.run(regen_cmd("verify", run["uri"]), env=run["env"], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert v.returncode == 0, v.stdout + v.stderr


def test_export_from_s3(run, tmp_path: Path) -> None:
    out = tmp_path / "export"
    p = subprocess.run(regen_cmd("export", run["uri"], "--out", str(out), "--shard-rows", "0"),
                       env=run["env"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    stats = json.loads((out / layout.EXPORT_STATS).read_text())
    assert stats["rows_read"] == len(run["rows"])
    lines = (out / layout.shard_name("pretokenized", 0)).read_text().splitlines()
    assert len(lines) == stats["rows_written"] > 0
