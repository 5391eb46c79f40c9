"""Output that reads in a log (issue 31, item 7): with no terminal (a pipe, a file, a Ray job's
log) and no $COLUMNS, nothing regen prints is cut at rich's default of 80 columns; `regen plan`
shows its limit legend only beside a starred row, and each rejected row once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from regen.cli.main import main
from regen.devkit.synthetic import make_snapshot, write_run_dir

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "manifests" / "demo.yaml"
LEGEND = "* reached the source's limit"


@pytest.fixture(autouse=True)
def no_columns(monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)


def test_plan_to_a_pipe_is_whole(capsys) -> None:
    assert main(["plan", str(DEMO)]) == 0
    out, err = capsys.readouterr()
    assert "…" not in out
    for word in ("rejected", "filtered", "output tok", "opencodereasoning", "2,032–3,768"):
        assert word in out, word
    assert LEGEND not in out  # no source reached its limit
    row = "source 'sharegpt' row 10: malformed_json"
    assert (out + err).count(row) == 1  # listed by the plan, not logged as well
    long_line = "row 13 field 'messages[0]': assistant_first (message 0 is an assistant turn"
    assert long_line in out  # one line, not broken at 80


def test_plan_shows_the_legend_beside_a_starred_row(capsys) -> None:
    assert main(["plan", str(DEMO), "-o", "sources.sharegpt.limit=3"]) == 0
    out = capsys.readouterr().out
    assert LEGEND in out and "3*" in out


def test_status_and_monitor_to_a_pipe_are_whole(tmp_path, capsys) -> None:
    now = time.time()
    write_run_dir(tmp_path / "run", make_snapshot(now), now=now)
    assert main(["monitor", str(tmp_path / "run"), "--once"]) == 0
    frame = capsys.readouterr().out
    assert "…" not in frame
    assert "http://10.0.0.5:30000/v1" in frame
    assert main(["status", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    assert f"run dir {tmp_path / 'run'}" in out  # every command names the absolute run dir


def test_a_log_line_is_never_broken_even_where_columns_is_set(monkeypatch) -> None:
    """$COLUMNS (pytest-xdist's workers, some CI shells, a Ray job's environment) sizes tables,
    but a line written to a log stays one line: a run dir path must not be split."""
    import io

    from monitor.render import make_console

    monkeypatch.setenv("COLUMNS", "40")
    out = io.StringIO()
    console = make_console(file=out)
    path = "/shared/" + "/".join(["a-long-folder-name"] * 8) + "/runs/demo"
    console.print(f"finished: 73/73 samples done; run dir {path}", highlight=False)
    assert out.getvalue() == f"finished: 73/73 samples done; run dir {path}\n"
