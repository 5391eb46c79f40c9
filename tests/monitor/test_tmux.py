"""Real terminal: `regen monitor` in a tmux pane on a live `regen run` against `regen simulate`.

A slow simulator (4 request slots, 12 ms per decode step, 10% degenerate answers) makes the demo
run's answers last ~10 s on a real local Ray head. The monitor starts before the run directory
exists. Two captures of the pane a few seconds apart must show more samples done, bracket what
`regen status --json` said between them, and after the run the pane must show exactly `regen
status --json`'s numbers, the flagged samples per source and their top reasons included.
Needs tmux (CI: ``apt-get install -y tmux``); skipped with the reason when it is missing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from regen.devkit.simulate import testing

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

TMUX = shutil.which("tmux")
if TMUX is None:
    pytest.skip("tmux is not installed (apt-get install -y tmux)", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "manifests" / "demo.yaml"
REGEN = [sys.executable, "-m", "regen"]
SIM = {"model_name": "demo-target", "max_running_requests": 4, "step_ms": 12.0,
       "mean_tokens": 40.0, "degenerate_rate": 0.1}  # fmt: skip
PANE = ("150", "70")  # columns, rows: room for the whole frame in wide layout
#: one row of the sources table: name, bar, done, total, %, failed, truncated, flagged
ROW = re.compile(
    r"│ (\S+)(?: \(native\))?\s+[█░·]+\s+([\d,]+)\s+([\d,]+)\s+[\d.]+\s+([\d,]+)\s+([\d,]+)"
    r"\s+([\d,]+)\s"
)
RATE = re.compile(r"│ (1|5|15) min\s+([\d,]+) tok/s")


class Pane:
    """A tmux server of our own (own socket) running one command in a fixed-size pane."""

    def __init__(self, sock: Path, command: str) -> None:
        self.base = [TMUX, "-S", str(sock)]
        subprocess.run([*self.base, "new-session", "-d", "-s", "mon", "-x", PANE[0], "-y",
                        PANE[1], command], check=True, timeout=30)  # fmt: skip

    def capture(self) -> str:
        r = subprocess.run([*self.base, "capture-pane", "-p", "-t", "mon"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
        return r.stdout

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=30)


def parse(screen: str) -> dict[str, Any] | None:
    """The numbers a complete frame shows, or None while the frame is partial."""
    rows = {m[1]: tuple(int(x.replace(",", "")) for x in m.groups()[1:])
            for m in ROW.finditer(screen)}  # fmt: skip
    rates = {int(m[1]): int(m[2].replace(",", "")) for m in RATE.finditer(screen)}
    state = re.search(r"[●◐✖✔■○] (RUNNING|STALLED|DEAD|FINISHED|INTERRUPTED|FAILED|STARTING)",
                      screen)  # fmt: skip
    if "TOTAL" not in rows or state is None:
        return None
    return {"rows": rows, "rates": rates, "state": state[1].lower()}


def wait_for(pane: Pane, pred: Callable[[dict[str, Any]], bool], timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    screen = ""
    while time.monotonic() < deadline:
        screen = pane.capture()
        if "MONITOR-EXITED" in screen:
            break
        got = parse(screen)
        if got is not None and pred(got):
            got["screen"] = screen
            return got
        time.sleep(0.25)
    raise AssertionError(f"the pane never showed what was expected; last screen:\n{screen}")


def wait_text(pane: Pane, needle: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    screen = ""
    while time.monotonic() < deadline:
        screen = pane.capture()
        if needle in screen or "MONITOR-EXITED" in screen:
            break
        time.sleep(0.25)
    return screen


def partly_done(got: dict[str, Any]) -> bool:
    done, total = got["rows"]["TOTAL"][:2]
    return got["state"] == "running" and 0 < done < total


def status_json(run_dir: Path) -> dict[str, Any]:
    r = subprocess.run([*REGEN, "status", str(run_dir), "--json"], capture_output=True,
                       text=True, timeout=60, check=True)  # fmt: skip
    return json.loads(r.stdout)


def table_of(status: dict[str, Any]) -> dict[str, tuple[int, int, int, int, int]]:
    rows = {s["name"]: (s["done"], s["total"], s["failed"], s["truncated"], s["flagged"])
            for s in status["sources"]}  # fmt: skip
    rows["TOTAL"] = (status["done"], status["total"], status["failed"], status["truncated"],
                     status["flagged"])  # fmt: skip
    return rows


@pytest.fixture(scope="module")
def live_run(tmp_path_factory, ray_head, ray_env) -> Iterator[dict[str, Any]]:
    """Start the monitor in tmux, then the run; yield captures and status taken along the way."""
    tmp = tmp_path_factory.mktemp("tmux")
    run_dir = tmp / "run"
    monitor = " ".join([*REGEN, "monitor", str(run_dir), "--refresh", "0.5"])
    with testing.running_simulator(**SIM) as sim:
        # without COLUMNS/LINES (set under pytest) rich sizes the frame from the pane itself
        command = (
            f"cd {REPO} && env -u COLUMNS -u LINES {monitor}; echo MONITOR-EXITED $?; sleep 600"
        )
        pane = Pane(tmp / "tmux.sock", command)
        log = (tmp / "run.log").open("wb")
        proc = None
        try:
            waiting = wait_text(pane, "does not exist", timeout_s=60)  # no run directory yet
            cmd = [*REGEN, "--log-level", "WARNING", "run", str(DEMO), "--out", str(run_dir),
                   "--endpoint", sim.url, "--address", ray_head.address, "--workers", "1",
                   "--concurrency", "4"]  # fmt: skip
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ray_env,
                                    start_new_session=True)  # fmt: skip
            first = wait_for(pane, partly_done, timeout_s=150)
            between = status_json(run_dir)
            time.sleep(3.0)
            second = wait_for(pane, lambda g: g["rows"]["TOTAL"][0] > first["rows"]["TOTAL"][0],
                              timeout_s=60)  # fmt: skip
            assert proc.wait(timeout=180) == 0, (tmp / "run.log").read_text()[-3000:]
            final = wait_for(pane, lambda g: g["state"] == "finished", timeout_s=30)
            yield {"waiting": waiting, "first": first, "between": between, "second": second,
                   "final": final, "final_status": status_json(run_dir)}  # fmt: skip
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            log.close()
            pane.close()


def test_monitor_waits_for_a_run_directory_that_does_not_exist_yet(live_run) -> None:
    assert "does not exist" in live_run["waiting"]
    assert "MONITOR-EXITED" not in live_run["final"]["screen"]


def test_two_captures_show_progress_advancing(live_run) -> None:
    a, b = live_run["first"]["rows"], live_run["second"]["rows"]
    assert b["TOTAL"][0] > a["TOTAL"][0]
    assert b["TOTAL"][1] == a["TOTAL"][1] == 73  # the demo's samples
    assert all(b[s][0] >= a[s][0] for s in a)


def test_status_between_the_captures_lies_between_them(live_run) -> None:
    mid = table_of(live_run["between"])
    a, b = live_run["first"]["rows"], live_run["second"]["rows"]
    assert set(mid) == set(a) == set(b)
    for s in mid:
        assert a[s][0] <= mid[s][0] <= b[s][0], s
        assert a[s][1] == mid[s][1] == b[s][1], s


def test_final_pane_shows_exactly_the_status_numbers(live_run) -> None:
    status, shown = live_run["final_status"], live_run["final"]
    assert status["state"] == shown["state"] == "finished"
    assert shown["rows"] == table_of(status)
    assert status["done"] == status["total"] == 73
    for r in status["rates"]:
        assert shown["rates"].get(int(r["window_s"] // 60)) == round(r["tok_s"]), shown["screen"]
    assert "in flight" in shown["screen"]
    assert "✔ FINISHED" in shown["screen"] and "ETA" in shown["screen"]


def test_final_pane_shows_the_flagged_samples_and_their_top_reasons(live_run) -> None:
    from monitor.render import top_flags

    status, screen = live_run["final_status"], live_run["final"]["screen"]
    assert status["flagged"] > 0 and status["flags"]
    assert "flagged" in screen and "top flags" in screen
    lines = screen.splitlines()
    total = next(ln for ln in lines if "│ TOTAL" in ln)
    assert top_flags(status["flags"]) in total
    for s in status["sources"]:
        if s["flags"]:
            line = next(ln for ln in lines if f"│ {s['name']} " in ln)
            assert top_flags(s["flags"]) in line, (s, line)
