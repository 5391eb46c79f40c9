"""Benchmark: the cost of one dashboard refresh tick on a 1,000,000-row run directory.

Builds (or reuses, with --dir) a synthetic run directory whose parts/ hold ``--rows`` Parquet
rows and whose progress.json carries counters of a run that size, then times ``--ticks``
refresh ticks: read progress.json + lock.json + run.json, compute the numbers, render the frame
to a string. Target: <= 200 ms per tick. Run: ``.venv/bin/python benchmarks/monitor_refresh.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from monitor.render import render_text
from regen.devkit.synthetic import PRODUCTION_SOURCES, make_snapshot, write_parts, write_run_dir
from regen.status import RunView

TARGET_MS = 200.0


def build(root: Path, rows: int) -> tuple[float, int]:
    """Write the synthetic run directory; returns (seconds, parts)."""
    t0 = time.perf_counter()
    now = time.time()
    base_rows = sum(round(n * turns) for _, n, regen, _, turns in PRODUCTION_SOURCES if regen)
    scale = rows / base_rows  # counters of a run whose parts hold `rows` rows
    sources = tuple(
        (name, round(n * scale), regen, per_turn, turns)
        for name, n, regen, per_turn, turns in PRODUCTION_SOURCES
    )
    snap = make_snapshot(now, fraction=1.0, sources=sources)
    write_run_dir(root, snap, now=now)
    parts = write_parts(root, rows)
    return time.perf_counter() - t0, parts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--ticks", type=int, default=50)
    ap.add_argument("--dir", type=Path, default=None, help="reuse/keep this run directory")
    args = ap.parse_args(argv)
    console = Console(highlight=False, soft_wrap=True)
    tmp = None
    root = args.dir
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="regen-bench-")
        root = Path(tmp.name)
    if not (root / "progress.json").exists():
        secs, parts = build(root, args.rows)
        console.print(f"built {args.rows:,} rows in {parts} parts at {root} in {secs:.1f} s")
    size = sum(p.stat().st_size for p in (root / "parts").glob("*.parquet"))
    console.print(f"parts/: {size / 1e6:.0f} MB; progress.json: "
                  f"{(root / 'progress.json').stat().st_size / 1e3:.1f} kB")  # fmt: skip

    t0 = time.perf_counter()
    view = RunView(root)  # opened once, like the dashboard
    open_ms = (time.perf_counter() - t0) * 1e3
    times = []
    for _ in range(args.ticks):
        t0 = time.perf_counter()
        numbers = view.numbers()
        text = render_text(numbers, width=120)
        times.append((time.perf_counter() - t0) * 1e3)
    assert "TOTAL" in text and numbers.rows >= args.rows * 0.9
    times.sort()
    p50 = statistics.median(times)
    p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
    ok = p50 <= TARGET_MS
    console.print(
        f"refresh tick (read progress/lock/run.json + compute + render 120 cols), "
        f"{args.ticks} ticks on {numbers.rows:,} rows: open {open_ms:.1f} ms, "
        f"mean {statistics.fmean(times):.1f} ms, p50 {p50:.1f} ms, p95 {p95:.1f} ms, "
        f"max {times[-1]:.1f} ms -> {'OK' if ok else 'OVER'} (target <= {TARGET_MS:.0f} ms)"
    )
    # for scale: what one tick would cost if it rescanned the parts (the monitor never does)
    import pyarrow.dataset as ds

    t0 = time.perf_counter()
    scanned = ds.dataset(root / "parts", format="parquet").to_table(columns=["sample_id"])
    scan_ms = (time.perf_counter() - t0) * 1e3
    console.print(f"(for comparison, one scan of the sample_id column of parts/: "
                  f"{scan_ms:.0f} ms for {scanned.num_rows:,} rows)")  # fmt: skip
    if tmp is not None:
        tmp.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
