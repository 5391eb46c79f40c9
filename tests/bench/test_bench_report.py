"""bench.json: round trip, the schema version, damaged and foreign files; the terminal tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _bench_common import report
from rich.console import Console

from regen.bench.console import print_report
from regen.bench.report import BenchReport, read_report, write_report
from regen.core.errors import ConfigError

REFERENCE = {1: (90.0, 144.0), 4: (340.0, 480.0), 16: (1200.0, 1250.0), 64: (4000.0, 3640.0)}


def test_round_trip(tmp_path: Path) -> None:
    rep = report(REFERENCE, {"sharegpt": 2.6, "xlam": 1.4})
    path = write_report(rep, tmp_path / "bench.json")
    assert not list(tmp_path.glob(".tmp-*"))
    back = read_report(path)
    assert back == rep
    data = json.loads(path.read_text())
    assert data["schema_version"] == 1
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 4, 16, 64]
    assert data["levels"][0]["speedup"] == pytest.approx(1.6)
    assert back.source("xlam").accept_length == 1.4
    with pytest.raises(KeyError):
        back.source("nope")


@pytest.mark.parametrize(
    ("mutate", "expect"),
    [
        (lambda d: d.update(schema_version=2), "schema_version 2; this regen reads 1"),
        (lambda d: d.pop("schema_version"), "schema_version None"),
        (lambda d: d.update(colour="red"), "colour: unknown key (not allowed here)"),
        (lambda d: d["levels"][0].pop("baseline"), "levels.0.baseline: Field required"),
        (lambda d: d["servers"].update(third={}), "servers.third"),
    ],
)
def test_foreign_or_damaged_reports_are_refused(tmp_path: Path, mutate, expect: str) -> None:
    data = json.loads(report(REFERENCE, {"s": 2.0}).model_dump_json())
    mutate(data)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as e:
        read_report(path)
    assert expect in str(e.value) and str(path) in str(e.value)


def test_unreadable_reports(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        read_report(tmp_path / "missing.json")
    (tmp_path / "cut.json").write_text('{"schema_version": 1, "levels": [')
    with pytest.raises(ConfigError, match="not JSON"):
        read_report(tmp_path / "cut.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ConfigError, match="expected an object"):
        read_report(tmp_path / "list.json")


def test_report_has_no_secret_fields() -> None:
    fields = set(BenchReport.model_json_schema()["$defs"]["BenchSettings"]["properties"])
    assert "api_key_env" in fields and not {"api_key", "key"} & fields


def test_terminal_tables_fit_80_columns() -> None:
    rep = report(REFERENCE, {"sharegpt": 2.6, "xlam": 1.4, "magicoder": 3.1})
    console = Console(width=80, record=True, color_system=None)
    print_report(rep, console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text  # nothing cut
    for needle in ("tok/s", "TTFT", "speedup", "1.60×", "0.91×", "xlam", "tool-calling", "1.40"):
        assert needle in text
    assert "speedup crosses 1 near concurrency" in text
    assert "acceptance on xlam 1.4 vs" in text
