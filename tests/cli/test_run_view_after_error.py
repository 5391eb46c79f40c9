"""No line contradicts the error after it (issue 31, item 5): `regen run` whose endpoint is
unreachable stops before its session writes anything, and its progress view (a log line per
tick when stdout is no terminal) shows nothing, not an earlier session's numbers ("failed
0/5 ... endpoints 1/1 up") before "error: no usable endpoint"."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from regen.cli.main import EXIT_CONFIG, main
from regen.store import RunDir, layout
from regen.store.progress import EndpointProgress, ProgressSnapshot

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "manifests" / "demo.yaml"


def dead_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def earlier_session(out: Path, url: str) -> None:
    """What an interrupted session left: its endpoint up, samples left."""
    snap = ProgressSnapshot(name="demo", model="demo-target", session="S0", host="h", pid=1,
                            state="interrupted", endpoints_configured=[url],
                            endpoints=[EndpointProgress(url=url, healthy=True)])  # fmt: skip
    layout.PROGRESS_FILE.write(RunDir.open(out), snap)


@pytest.mark.parametrize("resumed", [False, True], ids=["fresh", "resumed"])
def test_the_view_says_nothing_before_the_error(tmp_path, capsys, resumed) -> None:
    out, url = tmp_path / "run", dead_endpoint()
    if resumed:
        earlier_session(out, url)
    code = main(["run", str(DEMO), "--out", str(out), "--endpoint", url])
    assert code == EXIT_CONFIG
    captured = capsys.readouterr()
    assert "no usable endpoint for model 'demo-target'" in captured.err
    view = [ln for ln in captured.err.splitlines() if "monitor.live" in ln or " | " in ln]
    assert view == []
    assert "endpoints" not in captured.out
