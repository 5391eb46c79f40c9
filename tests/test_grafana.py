"""grafana/regen.json: a dashboard Grafana can import, whose every query names a metric regen or
the servers really export (regen's from regen.engine.metrics.METRICS under Ray's names; the
servers' from the simulator's SGLang and vLLM pages, which tests/contract holds against the
engines' own code), and whose PromQL Prometheus's own parser accepts (``promtool``, Debian's
``prometheus`` package: skipped, saying so, where it is not installed; CI installs it); and
grafana/regen-alerts.yml, alerting rules held to the same."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from regen.client.server_load import parse_page
from regen.devkit.simulate.config import SimConfig
from regen.devkit.simulate.metrics_page import SimMetrics
from regen.devkit.simulate.scheduler import Scheduler
from regen.devkit.simulate.testing import EAGLE3_OPTIONS
from regen.engine.metrics import METRICS

DASHBOARD = Path(__file__).resolve().parents[1] / "grafana" / "regen.json"
ALERTS = DASHBOARD.with_name("regen-alerts.yml")

#: PromQL words that are not metric names
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "inf", "nan"}  # fmt: skip
_CLAUSE = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"(?<![A-Za-z0-9_:.])[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (label matchers, label lists of clauses,
    ranges, strings and function names left out)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = _CLAUSE.sub(" ", s)
    out = set()
    for m in _NAME.finditer(s):
        rest = s[m.end() :].lstrip()
        if rest.startswith("(") or m.group() in KEYWORDS:
            continue
        out.add(m.group())
    return out


def exported_by_servers() -> set[str]:
    """Every sample name the simulator's SGLang and vLLM pages can carry."""
    names: set[str] = set()
    for engine in ("sglang", "vllm"):
        config = SimConfig.from_flat({"engine": engine, "enable_metrics": True, **EAGLE3_OPTIONS})
        scheduler = Scheduler(config.slots, config.step_s, config.tokens_per_step)
        page = parse_page(SimMetrics(config, scheduler, config.speculation()).render().decode())
        for f in page.families.values():
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
            names |= {f.name + s for s in suffixes.get(f.type, [""])}
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def panels(dashboard: dict) -> list[dict]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in panels(dashboard) for t in p["targets"]]


def test_it_is_a_dashboard_grafana_imports(dashboard: dict) -> None:
    assert isinstance(dashboard["uid"], str) and 0 < len(dashboard["uid"]) <= 40
    assert dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                 for y in range(g["y"], g["y"] + g["h"])}  # fmt: skip
        assert not cells & taken, f"{p['title']} overlaps another panel"
        taken |= cells
    for p in panels(dashboard):
        assert p["type"] in ("timeseries", "stat") and p["title"]
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])


def test_every_metric_it_names_is_exported_by_regen_or_the_servers(dashboard: dict) -> None:
    regen = {m.exported for m in METRICS}
    servers = exported_by_servers()
    named = set().union(*(metric_names(e) for e in exprs(dashboard)))
    assert named - regen - servers == set()
    # what an operator looks for: throughput, done per source, queue depth, errors, ETA
    assert {"ray_regen_tokens_out_total", "ray_regen_samples_done", "ray_regen_errors_total",
            "ray_regen_eta_seconds", "sglang:num_queue_reqs",
            "vllm:num_requests_waiting"} <= named  # fmt: skip


def alert_exprs() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def test_the_alerts_name_only_what_regen_exports() -> None:
    regen = {m.exported for m in METRICS}
    named = set().union(*(metric_names(e) for e in alert_exprs()))
    assert named and named <= regen
    assert "ray_regen_tokens_out_total" in named  # the 3 a.m. alert: tokens/s fell to zero


def test_the_name_reader_reads_promql() -> None:
    e = ('histogram_quantile(0.9, sum by (instance, le) (rate(a:b_bucket{x="y,z"}[5m]))) '
         '/ on (job) group_left (c) max without (d) (e_total offset 5m) + time()')  # fmt: skip
    assert metric_names(e) == {"a:b_bucket", "e_total"}


def test_prometheus_parses_every_query(dashboard: dict, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian's prometheus package; .ci/run installs it)")
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs(dashboard))
    ]}]}  # fmt: skip
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    run = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(exprs(dashboard))} rules found" in run.stdout + run.stderr
    run = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(alert_exprs())} rules found" in run.stdout + run.stderr
