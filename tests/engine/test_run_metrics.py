"""regen's own metrics: ``regen run --metrics-port`` serves them while a real run goes (against
the simulator, on the test session's Ray head), they say what ``regen status --json`` says, a
real Prometheus (Debian's ``prometheus``) scrapes them during the same run and PromQL answers
what ``regen status --json`` answers, and Ray's own export carries them under the same names
(a real local Ray in a subprocess)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from _runs import DEMO, regen_cmd, wait_until

from regen.client.server_load import counter_total, parse_page
from regen.devkit.procs import kill_group, stop_group
from regen.devkit.simulate.testing import running_simulator
from regen.engine.metrics import METRICS, RAY_PREFIX, RunMetrics

pytestmark = pytest.mark.ray

#: a slow server: the run lasts long enough to be scraped while it goes
SIM = {"model_name": "demo-target", "max_running_requests": 2, "step_ms": 10.0,
       "mean_tokens": 40.0}  # fmt: skip
EXPORTED = {m.exported for m in METRICS}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def page(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()
    except (urllib.error.URLError, OSError):
        return None


def per_source(text: str, name: str) -> dict[str, float]:
    return {s.labels["source"]: s.value for s in parse_page(text).samples if s.name == name}


def status_json(out: Path, env: dict[str, str]) -> dict:
    run = subprocess.run(regen_cmd("status", str(out), "--json"), env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


PROMETHEUS_YML = """\
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: regen
    static_configs: [{{targets: ["127.0.0.1:{port}"]}}]
"""


def promql(port: int, query: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as r:
        answer = json.loads(r.read())
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


@pytest.fixture(scope="module")
def metrics_run(tmp_path_factory, ray_head, ray_env) -> dict[str, Any]:
    """One run of the demo with ``--metrics-port``, watched by a real Prometheus (Debian's
    ``prometheus``, where installed) scraping its page: the first page that shows a done
    sample; then, with three done, the server frozen (SIGSTOP) so the run's numbers hold still
    while Prometheus scrapes them and `regen status --json` is asked; then it goes on and the
    run finishes."""
    tmp = tmp_path_factory.mktemp("metrics")
    port, pport = free_port(), free_port()
    binary = shutil.which("prometheus")
    prom = prom_log = None
    if binary is not None:
        (tmp / "prometheus.yml").write_text(PROMETHEUS_YML.format(port=port))
        prom_log = (tmp / "prometheus.log").open("wb")
        prom = subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{pport}"],
            stdout=prom_log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    out = tmp / "run"
    got: dict[str, Any] = {"out": out, "prometheus": binary}
    try:
        with running_simulator(**SIM) as sim:
            cmd = regen_cmd("run", str(DEMO), "--out", str(out), "--endpoint", sim.url,
                            "--address", ray_head.address, "--no-view",
                            "--metrics-port", str(port))  # fmt: skip
            log = (tmp / "run.log").open("wb")
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ray_env,
                                    start_new_session=True)  # fmt: skip
            seen: list[str] = []

            def some_done() -> bool:
                text = page(port)
                done = sum(per_source(text, "ray_regen_samples_done").values()) if text else 0
                if done and not seen:
                    seen.append(text)  # type: ignore[arg-type]
                return done >= 3 or proc.poll() is not None

            try:
                assert wait_until(some_done, timeout_s=180)
                got["seen"] = seen
                got["running_at_freeze"] = proc.poll() is None
                if binary is not None and got["running_at_freeze"]:
                    assert sim.process is not None
                    os.kill(sim.process.pid, signal.SIGSTOP)  # the run's numbers stop moving
                    try:
                        got["frozen"] = _held_still(port)
                        got["frozen_status"] = status_json(out, ray_env)
                        want = {s["name"]: float(s["done"])
                                for s in got["frozen_status"]["sources"]}  # fmt: skip

                        def scraped() -> dict[str, float]:
                            rows = promql(pport, "max by (source) (ray_regen_samples_done)")
                            return {r["metric"]["source"]: float(r["value"][1]) for r in rows}

                        got["scraped_equal"] = wait_until(lambda: scraped() == want,
                                                          timeout_s=60)  # fmt: skip
                        got["scraped"] = scraped()
                    finally:
                        os.kill(sim.process.pid, signal.SIGCONT)
                got["rc"] = proc.wait(timeout=300)
                got["log"] = (tmp / "run.log").read_text()[-3000:]
            finally:
                if proc.poll() is None:
                    proc.kill()
                log.close()
        got["page_after"] = page(port)
    finally:
        if prom is not None:
            stop_group(prom, 10)
        if prom_log is not None:
            prom_log.close()
    return got


def test_a_run_serves_its_metrics_and_they_say_what_status_says(metrics_run, ray_env) -> None:
    out = metrics_run["out"]
    assert metrics_run["rc"] == 0, metrics_run["log"]
    seen = metrics_run["seen"]
    assert seen, "the run ended before its page showed a done sample"
    mid = parse_page(seen[0])
    names = {f.name for f in mid.families.values()} | {s.name for s in mid.samples}
    assert {"ray_regen_samples_done", "ray_regen_tokens_out_total"} <= names
    assert mid.families["ray_regen_tokens_out"].type == "counter"
    assert metrics_run["page_after"] is None  # the page closed with the run

    # the finished run's numbers, published the same way, equal regen status --json
    metrics = RunMetrics(str(out), port=0)
    try:
        assert metrics.publish_once()
        text = page(metrics.port)
    finally:
        metrics.stop()
    assert text is not None
    status = status_json(out, ray_env)
    want = {s["name"]: s["done"] for s in status["sources"]}
    assert per_source(text, "ray_regen_samples_done") == want and sum(want.values()) > 0
    assert per_source(text, "ray_regen_samples_left") == {s["name"]: s["remaining"]
                                                          for s in status["sources"]}  # fmt: skip
    tokens = per_source(text, "ray_regen_tokens_out_total")
    assert tokens == {s["name"]: s["completion_tokens"] for s in status["sources"]}
    state = {s.labels["state"]: s.value for s in parse_page(text).samples
             if s.name == "ray_regen_run_state"}  # fmt: skip
    assert state[status["state"]] == 1 and sum(state.values()) == 1
    got = {f.name for f in parse_page(text).families.values()}
    assert {n.removesuffix("_total") for n in EXPORTED} - {"ray_regen_eta_seconds"} <= got


def test_a_real_prometheus_scrapes_a_run_and_promql_says_what_status_says(metrics_run) -> None:
    """The server is frozen (SIGSTOP) mid-run, so the run's numbers hold still while
    Prometheus scrapes them; then it goes on and the run finishes."""
    if metrics_run["prometheus"] is None:
        pytest.skip("Debian's prometheus is not installed (.ci/run installs it)")
    assert metrics_run["running_at_freeze"], "the run ended before it could be frozen"
    status = metrics_run["frozen_status"]
    want = {s["name"]: float(s["done"]) for s in status["sources"]}
    assert per_source(metrics_run["frozen"], "ray_regen_samples_done") == want
    assert metrics_run["scraped_equal"], (metrics_run["scraped"], want)
    assert status["state"] == "running" and sum(want.values()) >= 3
    assert metrics_run["rc"] == 0, metrics_run["log"]


def _held_still(port: int, apart_s: float = 6.0, timeout_s: float = 60.0) -> str:
    """The page once two readings ``apart_s`` apart (past a publication) show the same
    numbers."""
    deadline = time.monotonic() + timeout_s
    before = page(port)
    while time.monotonic() < deadline:
        time.sleep(apart_s)
        now = page(port)
        keep = ("ray_regen_samples_done", "ray_regen_samples_left", "ray_regen_tokens_out_total")
        if before and now and all(per_source(before, k) == per_source(now, k) for k in keep):
            return now
        before = now
    raise AssertionError("the run's numbers did not hold still with the server frozen")


def test_a_taken_metrics_port_is_a_configuration_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        run = subprocess.run(regen_cmd("run", str(DEMO), "--out", str(tmp_path / "r"),
                                       "--no-view", "--metrics-port", str(port)),
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 2 and "--metrics-port" in run.stderr
    assert not (tmp_path / "r").exists()  # refused before anything started


#: publishes two readings through ray.util.metrics in a local Ray of its own, then waits
PROBE = textwrap.dedent("""
    import sys, time
    import ray
    from regen.engine.metrics import RayMetrics
    port, tmp = int(sys.argv[1]), sys.argv[2]
    ray.init(include_dashboard=False, num_cpus=1, _node_ip_address="127.0.0.1",
             _metrics_export_port=port, _temp_dir=tmp, logging_level="ERROR")
    m = RayMetrics()
    series = {
        "regen_samples_done": [({"source": "a"}, 3.0), ({"source": "b"}, 1.0)],
        "regen_tokens_out": [({"source": "a"}, 100.0)],
        "regen_requests_in_flight": [({"endpoint": "http://e/v1"}, 2.0)],
    }
    assert m.publish(series)
    series["regen_tokens_out"] = [({"source": "a"}, 250.0)]
    series["regen_samples_done"] = [({"source": "a"}, 4.0), ({"source": "b"}, 1.0)]
    m.publish(series)
    print("published", flush=True)
    time.sleep(600)
""")


def test_rays_export_carries_them_under_the_pages_names(ray_env) -> None:
    port = free_port()
    # a short path: the socket paths under it have a length limit
    tmp = tempfile.mkdtemp(prefix="regen-metrics-ray-")
    proc = subprocess.Popen([sys.executable, "-c", PROBE, str(port), tmp],
                            env=ray_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    texts: list[str] = []

    def exported() -> bool:
        text = page(port)
        if text and "ray_regen_tokens_out_total" in text:
            samples = parse_page(text).samples
            if counter_total(samples, "ray_regen_tokens_out_total") == 250:
                texts.append(text)
        return bool(texts) or proc.poll() is not None

    try:
        ok = wait_until(exported, timeout_s=120, step_s=1.0)
    finally:
        kill_group(proc, 30)
        shutil.rmtree(tmp, ignore_errors=True)
        said = proc.communicate(timeout=30)[0]  # what it printed, and its pipe closed
    assert ok and texts, (said or b"").decode()[-3000:]
    page_ = parse_page(texts[0])
    regen = {f.name: f for f in page_.families.values() if f.name.startswith(RAY_PREFIX + "regen")}
    assert regen["ray_regen_samples_done"].type == "gauge"
    assert per_source(texts[0], "ray_regen_samples_done") == {"a": 4.0, "b": 1.0}
    assert regen["ray_regen_tokens_out"].type == "counter"  # 100, then 150 more: one series
    # the names Ray exports are the ones regen's own page serves and the dashboard queries
    assert {"ray_regen_samples_done", "ray_regen_tokens_out_total",
            "ray_regen_requests_in_flight"} <= EXPORTED  # fmt: skip
    assert set(regen) <= {n.removesuffix("_total") for n in EXPORTED}
