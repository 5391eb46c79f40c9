"""The dashboard frame and `regen monitor --once` on synthetic run directories."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from _runs import read_numbers

from monitor.render import Histogram, fmt_duration, fmt_len, fmt_tokens, progress_bar, render_text
from regen.cli.main import main
from regen.devkit.synthetic import ENDPOINTS, make_snapshot, write_run_dir

NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def live_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A realistic running run: lock held by this process, heartbeat fresh (at real time)."""
    d = tmp_path_factory.mktemp("live")
    now = time.time()
    write_run_dir(d, make_snapshot(now), now=now)
    return d


def test_once_prints_one_frame_with_the_key_numbers(live_dir: Path, capsys) -> None:
    assert main(["monitor", str(live_dir), "--once", "--width", "130"]) == 0
    out = capsys.readouterr().out
    n = read_numbers(live_dir)
    assert "kimi-k25-eagle3-regen" in out and "moonshotai/Kimi-K2.5" in out
    assert "● RUNNING" in out
    for s in n.sources:
        line = next(ln for ln in out.splitlines() if f" {s.name} " in ln)
        assert f"{s.done:,}" in line and f"{s.total:,}" in line
    total = next(ln for ln in out.splitlines() if "TOTAL" in ln)
    assert "44,831" in total and "88,088" in total and "91" in total and "201" in total
    for r in n.rates:
        assert f"{r.tok_s:,.0f} tok/s" in out
    assert n.eta is not None and fmt_duration(n.eta.seconds) in out
    assert f"{fmt_duration(n.eta.low_s)} – {fmt_duration(n.eta.high_s)}" in out
    assert next(ln for ln in out.splitlines() if "in flight" in ln).split("│")[1].split() == [
        "in",
        "flight",
        "127",
    ]
    for url in ENDPOINTS:
        assert url.removeprefix("http://").removesuffix("/v1") in out
    assert "DOWN" in out and "41.8s" in out
    assert "server_error" in out and "503 Service Unavailable" in out and "183" in out
    assert "output tokens / turn" in out and "1.5K" in out and "32K+" in out
    assert len(out.splitlines()) < 60


def test_frame_fits_the_width(live_dir: Path) -> None:
    n = read_numbers(live_dir)
    for width in (80, 100, 120, 160):
        text = render_text(n, width=width)
        assert max(len(line) for line in text.splitlines()) <= width
        assert "TOTAL" in text


def test_dead_run_frame(tmp_path: Path) -> None:
    write_run_dir(tmp_path, make_snapshot(NOW), now=NOW, lock="stale")
    text = render_text(read_numbers(tmp_path, NOW + 1))
    assert "✖ DEAD" in text and "heartbeat 10 min old" in text
    assert "│ ETA " in text and "finishes" not in text


def test_finished_run_frame(tmp_path: Path) -> None:
    s = make_snapshot(NOW, fraction=1.0, state="finished")
    for sp in s.sources.values():
        sp.failed = 0
    write_run_dir(tmp_path, s, now=NOW, lock="none")
    text = render_text(read_numbers(tmp_path, NOW + 3600))
    assert "✔ FINISHED" in text
    assert "100.0" in next(ln for ln in text.splitlines() if "TOTAL" in ln)
    assert "done" in next(ln for ln in text.splitlines() if "│ ETA " in ln)


def test_starting_run_without_progress(tmp_path: Path) -> None:
    write_run_dir(tmp_path, None, now=time.time())
    text = render_text(read_numbers(tmp_path))
    assert "STARTING" in text and "no finished turns yet" in text and "none" in text


def test_progress_bar_segments() -> None:
    bar = progress_bar(total=100, done=50, truncated=10, failed=25, width=20)
    assert bar.plain == "█" * 15 + "░" * 5
    styles = [(s.start, s.end, str(s.style)) for s in bar.spans]
    assert styles == [(0, 8, "green"), (8, 10, "yellow"), (10, 15, "red"), (15, 20, "grey35")]
    assert progress_bar(0, 0, 0, 0, width=5).plain == "·····"


def test_histogram_columns_and_narrow_fallback() -> None:
    from rich.console import Console

    def draw(width: int) -> list[str]:
        c = Console(width=width, file=io.StringIO())
        c.print(Histogram([0, 100, 200, 300], [0, 8, 2, 0], height=2))
        return [ln.rstrip() for ln in c.file.getvalue().splitlines()]  # type: ignore[attr-defined]

    # empty edge bins are dropped; 8 vs 2 turns on two rows: a full and a half-row bar (eighths)
    assert draw(40) == [" █████", " █████  ▄▄▄▄▄", "  100    200", "  80%    20%"]
    assert draw(7)[0] == "█▃"  # too narrow for columns: a sparkline


def test_formatters() -> None:
    assert fmt_tokens(1_234_567) == "1.2M" and fmt_tokens(999) == "999"
    assert fmt_len(512) == "512" and fmt_len(1536) == "1.5K" and fmt_len(32768) == "32K"
    assert fmt_duration(59) == "59s" and fmt_duration(3700) == "1h 01m"
    assert fmt_duration(200_000) == "2d 07h" and fmt_duration(None) == "—"


def test_once_on_a_pyarrow_uri_of_a_stopped_run(tmp_path: Path, capsys) -> None:
    write_run_dir(tmp_path, make_snapshot(NOW, state="interrupted"), now=NOW, lock="none")
    assert main(["monitor", f"file://{tmp_path}", "--once", "--width", "120"]) == 0
    out = capsys.readouterr().out
    assert "■ INTERRUPTED" in out and "44,831" in out


def test_once_on_a_missing_directory_is_one_clean_error(tmp_path: Path, capsys) -> None:
    assert main(["monitor", str(tmp_path / "nope"), "--once"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_flagged_counts_and_top_reasons_per_source(live_dir: Path) -> None:
    from monitor.render import top_flags

    n = read_numbers(live_dir)
    assert n.overall.flagged == sum(s.flagged for s in n.sources) > 0
    for width, k in ((160, 2), (120, 1)):
        text = render_text(n, width=width)
        header = next(ln for ln in text.splitlines() if " source " in ln)
        assert "flagged" in header and ("top flags" if k == 2 else "top flag") in header
        for s in n.sources:
            line = next(ln for ln in text.splitlines() if f" {s.name} " in ln)
            cells = line.split()
            assert f"{s.flagged:,}" in cells
            assert (top_flags(s.flags, k) or "—") in line
    assert top_flags({"refusal": 2, "repetition": 5, "empty_content": 5}) == "empty 5 repeat 5"
    narrow = render_text(n, width=100)
    assert "flagged" in narrow and "top flag" not in narrow


def test_new_attempts_are_shown_while_a_retry_runs(tmp_path: Path) -> None:
    s = make_snapshot(time.time(), fraction=1.0)
    s.sources["sharegpt"].retried, s.sources["sharegpt"].retrying = 30, 12
    write_run_dir(tmp_path, s, now=time.time())
    n = read_numbers(tmp_path)
    assert (n.overall.retried, n.overall.retrying) == (30, 12)
    assert n.remaining == 12  # what the retry still has to do
    text = render_text(n, width=130)
    assert "new attempts" in text and "30 stored · 12 to go" in text


def test_the_endpoint_panel_shows_the_servers_side_beside_regens_in_flight(
    live_dir: Path,
) -> None:
    """Per endpoint: regen's in flight, then the server's running, queued and KV usage from
    its /metrics (every client's: the second server is shared, 9 wait there); an endpoint
    without a reading shows dashes, and a stopped run shows no live server state."""
    from monitor.render import endpoints_panel

    n = read_numbers(live_dir)
    panel = io.StringIO()
    from rich.console import Console

    Console(file=panel, width=100, color_system=None).print(endpoints_panel(n))
    lines = panel.getvalue().splitlines()
    assert "run" in lines[1] and "queue" in lines[1] and "KV" in lines[1]
    rows = {}
    for url in ENDPOINTS:
        host = url.removeprefix("http://").removesuffix("/v1")
        rows[host] = next(ln for ln in lines if host in ln).strip("│ ").split()
    first, second, down = rows.values()
    assert first[1:6] == ["up", "64", "64", "2", "71%"]
    assert second[1:6] == ["up", "63", "64", "9", "93%"]
    assert down[1:6] == ["DOWN", "0", "—", "—", "—"]
    stopped = tmp_dir_numbers_stopped(live_dir)
    assert all(e.server_queued is None for e in stopped.endpoints)


def tmp_dir_numbers_stopped(live_dir: Path):
    """The same run's numbers once its lock is gone (not live: no server state shown)."""
    import shutil
    import tempfile

    from regen.devkit.synthetic import write_run_dir

    d = Path(tempfile.mkdtemp(prefix="regen-stopped-"))
    try:
        now = time.time()
        write_run_dir(d, make_snapshot(now), now=now, lock="none")
        return read_numbers(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_the_servers_side_is_exported_with_regens_metrics(live_dir: Path) -> None:
    """What the panel shows of each server is a gauge of regen's metrics too (Prometheus,
    Grafana); an endpoint with no reading has no series rather than a zero."""
    from regen.engine.metrics import values

    series = values(read_numbers(live_dir))
    queued = {tags["endpoint"]: v for tags, v in series["regen_endpoint_server_queued"]}
    kv = {tags["endpoint"]: v for tags, v in series["regen_endpoint_server_kv_usage"]}
    assert queued == {ENDPOINTS[0]: 2, ENDPOINTS[1]: 9}
    assert kv == {ENDPOINTS[0]: 0.71, ENDPOINTS[1]: 0.93}
    assert len(series["regen_endpoint_server_running"]) == 2
