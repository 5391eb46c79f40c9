"""A wrong RUN_DIR gets one line, never a traceback (issue 31, item 3): a file (such as the
manifest given where the run directory belongs), a path under a file, a missing directory and
a directory that holds no run, for every command that reads a run directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.cli.main import EXIT_CONFIG, main

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "manifests" / "demo-train.yaml"

COMMANDS = {
    "status": lambda d, tmp: ["status", d],
    "status --json": lambda d, tmp: ["status", d, "--json"],
    "verify": lambda d, tmp: ["verify", d],
    "monitor --once": lambda d, tmp: ["monitor", d, "--once"],
    "export": lambda d, tmp: ["export", d, "--out", str(tmp / "export")],
    "train --dry-run": lambda d, tmp: ["train", d, "--config", str(TRAIN), "--dry-run"],
}
WRONG = {
    "a file": (lambda tmp: tmp / "demo.yaml", "is a file, not a run directory"),
    "under a file": (lambda tmp: tmp / "demo.yaml" / "run", "does not exist"),
    "missing": (lambda tmp: tmp / "nowhere", "does not exist"),
}


@pytest.mark.parametrize("wrong", list(WRONG))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_one_line_naming_the_path(tmp_path, capsys, command, wrong) -> None:
    (tmp_path / "demo.yaml").write_text((REPO / "manifests" / "demo.yaml").read_text())
    path, says = WRONG[wrong]
    run_dir = path(tmp_path)
    code = main(["--log-level", "WARNING", *COMMANDS[command](str(run_dir), tmp_path)])
    out, err = capsys.readouterr()
    assert code == EXIT_CONFIG, out + err
    assert err == f"error: {'run directory ' if 'exist' in says else ''}{run_dir} {says}\n", err
    assert not (tmp_path / "export").exists()
