"""regen plan --reweight: the rule (budget, monotone, lowest acceptance grows most), refusals,
and the overlay loading with `regen plan -o` / load_manifest."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from _bench_common import REPO, report
from _bench_common import regen_cli as _cli

from regen.bench.report import write_report
from regen.bench.reweight import overlay_yaml, reason, reweight
from regen.core.errors import ConfigError
from regen.manifest import load_manifest

DEMO = REPO / "manifests" / "demo.yaml"
LEVELS = {1: (90.0, 144.0), 64: (4000.0, 3640.0)}


def test_lowest_acceptance_gets_the_largest_relative_increase() -> None:
    rep = report(LEVELS, {"sharegpt": 2.6, "xlam": 1.4, "magicoder": 3.1})
    current = {"sharegpt": 15000, "xlam": 6000, "magicoder": 8000}
    result = reweight(rep, current)
    by = {r.source: r for r in result.sources}
    assert sum(r.proposed for r in result.sources) == result.budget == 29000
    assert by["xlam"].change > by["sharegpt"].change > by["magicoder"].change
    assert by["xlam"].proposed > 6000 and by["magicoder"].proposed < 8000
    # the relative change is proportional to 1 / acceptance
    ratio = (1 + by["xlam"].change) / (1 + by["magicoder"].change)
    assert ratio == pytest.approx(3.1 / 1.4, rel=0.01)


@pytest.mark.parametrize("budget", [100, 29000, 50000])
def test_rule_is_monotone_for_any_counts_and_budget(budget: int) -> None:
    accepts = {"a": 1.2, "b": 1.9, "c": 2.4, "d": 3.3}
    rep = report(LEVELS, accepts)
    for counts in itertools.permutations([500, 2000, 7000, 12000]):
        current = dict(zip(accepts, counts, strict=True))
        result = reweight(rep, current, budget=budget)
        assert sum(r.proposed for r in result.sources) == budget
        changes = [r.proposed / r.current for r in result.sources]  # in acceptance order
        # lower acceptance never gets a smaller relative change (up to rounding of one sample)
        for (r0, c0), (r1, c1) in itertools.pairwise(zip(result.sources, changes, strict=True)):
            assert c0 + 1 / r0.current + 1 / r1.current >= c1


def test_unmeasured_sources_count_as_the_mean_and_native_counts_stay_out() -> None:
    rep = report(LEVELS, {"xlam": 1.4, "sharegpt": 2.8}, overall=2.1)
    result = reweight(rep, {"xlam": 1000, "sharegpt": 1000, "glaive": 1000})
    by = {r.source: r for r in result.sources}
    assert by["glaive"].accept is None and by["glaive"].weight == 1.0
    assert by["xlam"].weight == pytest.approx(2.1 / 1.4)
    assert by["xlam"].proposed > by["glaive"].proposed > by["sharegpt"].proposed
    assert "not measured by the bench" in reason(by["glaive"], result.mean_accept)


def test_benched_sources_missing_from_the_manifest_are_listed() -> None:
    rep = report(LEVELS, {"xlam": 1.4, "old_source": 2.0})
    result = reweight(rep, {"xlam": 100, "sharegpt": 100})
    assert result.ignored == ["old_source"]
    text = overlay_yaml(result, manifest="m.yaml", bench="bench.json", report=rep)
    assert "# old_source: in the bench but not in this manifest; ignored" in text


def test_small_sources_keep_at_least_one() -> None:
    rep = report(LEVELS, {"a": 1.0 + 1e-9, "b": 3.5}, overall=2.0)
    result = reweight(rep, {"a": 1000, "b": 1}, budget=1001)
    assert {r.source: r.proposed for r in result.sources}["b"] == 1


def test_refusals() -> None:
    broken = report(LEVELS, {"xlam": 1.0, "sharegpt": 1.02}, algorithm="EAGLE")
    with pytest.raises(ConfigError, match="the draft was not used"):
        reweight(broken, {"xlam": 10, "sharegpt": 10})
    rep = report(LEVELS, {"xlam": 1.4})
    with pytest.raises(ConfigError, match="no acceptance for any source of this manifest"):
        reweight(rep, {"sharegpt": 10})
    with pytest.raises(ConfigError, match="--budget"):
        reweight(rep, {"xlam": 10}, budget=-1)


def test_exhausted_sources_are_flagged_in_the_reasoning() -> None:
    rep = report(LEVELS, {"xlam": 1.4, "sharegpt": 2.6})
    result = reweight(rep, {"xlam": 7, "sharegpt": 9}, exhausted={"xlam"})
    row = next(r for r in result.sources if r.source == "xlam")
    assert row.exhausted and row.proposed > row.current
    assert "its rows ran out at 7" in reason(row, result.mean_accept)


def test_overlay_loads_with_load_manifest(tmp_path: Path) -> None:
    rep = report(LEVELS, {"sharegpt": 2.6, "xlam": 1.4, "magicoder": 3.1})
    result = reweight(rep, {"sharegpt": 9, "xlam": 7, "magicoder": 8}, budget=60)
    path = tmp_path / "reweight.yaml"
    path.write_text(overlay_yaml(result, manifest=str(DEMO), bench="bench.json", report=rep))
    data = yaml.safe_load(path.read_text())
    assert data == {"sources": {r.source: {"limit": r.proposed} for r in result.sources}}
    text = path.read_text()
    assert "# acceptance 1.40, below the mean" in text and "# rule: new limit ∝ current" in text
    m = load_manifest(DEMO, [str(path)])
    for r in result.sources:
        assert m.source(r.source).limit == r.proposed
    assert m.source("ultrachat").limit is None  # untouched
    # dotted overrides after the file still win
    m2 = load_manifest(DEMO, [str(path), "sources.xlam.limit=3"])
    assert m2.source("xlam").limit == 3


def regen_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return _cli(*args, env={"COLUMNS": "200"}, timeout=120)


def test_plan_reweight_writes_an_overlay_that_plan_loads(tmp_path: Path) -> None:
    """The real CLI on the demo manifest: xlam (lowest acceptance) grows most; `regen plan -o`
    then plans with the proposed limits."""
    rep = report(LEVELS, {"sharegpt": 2.6, "ultrachat": 2.5, "xlam": 1.4, "magicoder": 3.1})
    bench = write_report(rep, tmp_path / "bench.json")
    out = regen_cli("plan", str(DEMO), "--reweight", str(bench), "--budget", "40", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    overlay = tmp_path / "reweight.yaml"
    assert doc["overlay"] == str(overlay) and overlay.is_file()
    rows = {r["source"]: r for r in doc["sources"]}
    assert "kimi_native" not in rows  # native rows are not regenerated
    assert sum(r["proposed"] for r in rows.values()) == 40
    change = {k: r["proposed"] / r["current"] for k, r in rows.items()}
    assert max(change, key=change.get) == "xlam"
    assert min(change, key=change.get) == "magicoder"
    assert rows["xlam"]["exhausted"]  # the demo's sources have no limits: all rows were read

    planned = regen_cli("plan", str(DEMO), "-o", str(overlay), "--json")
    assert planned.returncode == 0, planned.stderr
    sources = json.loads(planned.stdout)["sources"]
    for name, row in rows.items():
        assert sources[name]["limit"] == row["proposed"]
        assert sources[name]["kept"] <= row["proposed"]

    table = regen_cli(
        "plan", str(DEMO), "--reweight", str(bench), "--write", str(tmp_path / "o.yaml")
    )
    assert table.returncode == 0, table.stderr
    assert "reweight: demo" in table.stdout and "xlam" in table.stdout
    assert f"regen plan {DEMO} -o {tmp_path / 'o.yaml'}" in table.stdout.replace("\n", "")


def test_plan_reweight_refuses_a_bad_bench(tmp_path: Path) -> None:
    bad = tmp_path / "bench.json"
    bad.write_text(json.dumps({"schema_version": 9}))
    out = regen_cli("plan", str(DEMO), "--reweight", str(bad))
    assert out.returncode == 2
    assert "schema_version 9" in out.stderr and "Traceback" not in out.stderr
