"""The refreshing view: ticks, error handling, the thread `regen run` starts, plain log lines."""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from pathlib import Path

import pytest
from _runs import read_numbers
from rich.console import Console

from monitor.live import Ticker, _log_tick, run_in_thread, watch
from monitor.plain import log_line
from regen.devkit.synthetic import make_snapshot, write_run_dir

NOW = 1_800_000_000.0


def test_log_line_carries_the_dashboard_numbers(tmp_path: Path) -> None:
    write_run_dir(tmp_path, make_snapshot(NOW), now=NOW)
    n = read_numbers(tmp_path, NOW, pid_alive=lambda pid: True)
    line = log_line(n)
    assert line.startswith(
        "kimi-k25-eagle3-regen running | 44,831/88,088 (51.0%) failed 91 trunc 201"
    )
    rates = "/".join(f"{r.tok_s:,.0f}" for r in n.rates)
    assert f"tok/s 1m/5m/15m {rates}" in line
    assert "in flight 127" in line and "endpoints 2/3 up" in line
    assert "errors 189 (top server_error x183)" in line
    assert "\n" not in line


def test_log_line_of_a_dead_and_of_a_finished_run(tmp_path: Path) -> None:
    write_run_dir(tmp_path, make_snapshot(NOW), now=NOW, lock="stale")
    assert " dead (heartbeat 10 min old) " in log_line(read_numbers(tmp_path, NOW))
    s = make_snapshot(NOW, fraction=1.0, state="finished")
    for sp in s.sources.values():
        sp.failed = 0
    write_run_dir(tmp_path, s, now=NOW, lock="none")
    assert "| ETA done |" in log_line(read_numbers(tmp_path, NOW))


def test_ticker_keeps_the_last_good_numbers_on_a_bad_read(tmp_path: Path) -> None:
    write_run_dir(tmp_path, make_snapshot(NOW), now=NOW)
    t = Ticker(tmp_path)
    first = t.tick(NOW)
    assert first is not None and t.error == ""
    (tmp_path / "run.json").write_text(json.dumps({"name": 7}))  # a failed read, kept apart
    assert t.tick(NOW) is first
    assert "run.json is damaged" in t.error
    text = _render(t, 120)
    assert "showing the last good read" in text and "kimi-k25-eagle3-regen" in text


def test_ticker_waits_for_a_directory_that_is_not_there_yet(tmp_path: Path) -> None:
    t = Ticker(tmp_path / "later")
    assert t.tick() is None
    assert "does not exist" in t.error and "does not" in _render(t, 200)
    write_run_dir(tmp_path / "later", make_snapshot(NOW), now=NOW)
    assert t.tick(NOW) is not None and t.error == ""


def _render(t: Ticker, width: int) -> str:
    c = Console(file=io.StringIO(), width=width)
    c.print(t.renderable(width))
    return c.file.getvalue()  # type: ignore[attr-defined]


def test_watch_on_a_terminal_redraws_until_stopped(tmp_path: Path) -> None:
    now = time.time()
    write_run_dir(tmp_path, make_snapshot(now), now=now)
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True, color_system=None)
    stop = threading.Event()
    th = run_in_thread(tmp_path, stop, refresh_s=0.05, console=console)
    deadline = time.monotonic() + 10
    while out.getvalue().count("TOTAL") < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    th.join(timeout=10)
    assert not th.is_alive()
    text = out.getvalue()
    assert text.count("TOTAL") >= 3  # several frames were drawn
    assert "44,831" in text and "RUNNING" in text


def test_watch_without_a_terminal_logs_plain_lines(tmp_path: Path, caplog) -> None:
    write_run_dir(tmp_path, make_snapshot(NOW), now=NOW, lock="stale")
    console = Console(file=io.StringIO(), width=120)  # not a terminal
    assert not console.is_terminal
    stop = threading.Event()
    stop.set()  # one line at once, then the final one
    with caplog.at_level(logging.INFO, logger="monitor.live"):
        last = watch(tmp_path, console=console, stop_event=stop, log_every_s=60)
    assert last is not None and last.overall.done == 44_831
    lines = [r.getMessage() for r in caplog.records if r.name == "monitor.live"]
    assert len(lines) == 2 and all("44,831/88,088" in ln for ln in lines)
    assert console.file.getvalue() == ""  # type: ignore[attr-defined]


def test_run_in_thread_never_raises_into_the_run(tmp_path: Path, caplog) -> None:
    stop = threading.Event()
    stop.set()
    with caplog.at_level(logging.DEBUG, logger="monitor.live"):
        th = run_in_thread(tmp_path / "missing", stop, console=Console(file=io.StringIO()))
        th.join(timeout=10)
    assert not th.is_alive()
    # a run directory that does not exist yet is expected at the start of `regen run`: no warning
    msgs = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "monitor.live"]
    assert msgs and all(lvl == logging.DEBUG and "does not exist" in m for lvl, m in msgs)


def test_plain_view_warns_when_a_readable_directory_breaks(tmp_path: Path, caplog) -> None:
    write_run_dir(tmp_path, make_snapshot(NOW), now=NOW)
    t = Ticker(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="monitor.live"):
        _log_tick(t)
        (tmp_path / "run.json").write_text(json.dumps({"name": 7}))
        _log_tick(t)
    levels = [r.levelno for r in caplog.records if r.name == "monitor.live" and r.levelno > 10]
    assert levels == [logging.INFO, logging.WARNING]


@pytest.mark.parametrize("refresh", ["0", "-1"])
def test_monitor_rejects_a_bad_refresh(tmp_path: Path, refresh: str, capsys) -> None:
    from regen.cli.main import main

    write_run_dir(tmp_path, make_snapshot(NOW), now=NOW)
    assert main(["monitor", str(tmp_path), "--refresh", refresh]) == 2
    assert "--refresh" in capsys.readouterr().err
