"""A configuration error costs nothing (issue 31, item 6): no endpoint, an unreachable one, or a
run directory path that cannot be one stop `regen run` with one line (exit 2) before any source
is read whole, before the run directory is created and before a native sample is stored."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from regen.cli.main import EXIT_CONFIG, main

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "manifests" / "demo.yaml"


def dead_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def regen_run(out: Path, *extra: str) -> int:
    return main(
        ["--log-level", "WARNING", "run", str(DEMO), "--out", str(out), "--no-view", *extra]
    )


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ((), "no endpoints given"),
        (("--endpoint", "DEAD"), "no usable endpoint for model 'demo-target'"),
    ],
)
def test_a_missing_or_dead_endpoint_is_found_first(tmp_path, capsys, caplog, extra, says) -> None:
    extra = tuple(dead_endpoint() if a == "DEAD" else a for a in extra)
    out = tmp_path / "run"
    assert regen_run(out, *extra) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err, err
    assert not out.exists()  # no plan index, no native sample, no progress.json
    rows = [r for r in caplog.records if "row" in r.getMessage() and r.levelname == "WARNING"]
    assert len(rows) < 5, [r.getMessage() for r in rows]  # the sources were not read whole


def test_a_file_as_the_run_directory_is_refused_before_anything(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    out.write_text("not a directory")
    assert regen_run(out, "--endpoint", dead_endpoint()) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err == f"error: --out {out} is a file, not a run directory\n"
    assert regen_run(out / "sub", "--endpoint", dead_endpoint()) == EXIT_CONFIG
    assert f"is under a file ({out})" in capsys.readouterr().err
