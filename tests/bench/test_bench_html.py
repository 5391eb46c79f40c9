"""bench.html: self-contained (plotly.js inlined, no network), and rendered by a real headless
Chromium (Debian's `chromium`): the screenshot is not blank and plotly drew both plots with
their SVG traces. The Chromium test skips, saying why, where no Chromium is installed
(.ci/run installs it with apt-get)."""

from __future__ import annotations

import html
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from _bench_common import report

from regen.bench.html import render_html, write_html

LEVELS = {1: (90.0, 144.0), 4: (340.0, 480.0), 16: (1200.0, 1250.0), 64: (4000.0, 3640.0)}
SOURCES = {"sharegpt": 2.6, "xlam": 1.4, "magicoder": 3.1, "glaive": None}
#: seconds Chromium gets per page (it starts cold)
CHROMIUM_TIMEOUT_S = 120


def test_page_is_self_contained_and_escaped() -> None:
    rep = report(LEVELS, {**SOURCES, "<script>": 2.0})
    page = render_html(rep)
    assert page.startswith("<!DOCTYPE html>")
    assert page.count('id="plot-throughput"') == 1 and page.count('id="plot-acceptance"') == 1
    # plotly.js is inlined once; nothing is fetched from the network
    assert page.count("plotly.js v") >= 1 and len(page) > 1_000_000
    # nothing is loaded from elsewhere (plotly.js's own map-tile defaults are never used here)
    assert not re.search(r"<script[^>]+src=", page)
    assert not re.search(r"<link[^>]+href=", page)
    assert "<td>&lt;script&gt;</td>" in page and "<td><script></td>" not in page
    for v in rep.verdicts:
        assert html.escape(v.text) in page


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _run_chromium(binary: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            binary,
            "--headless",
            "--no-sandbox",  # root in containers
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            f"--user-data-dir={tmp / 'profile'}",
            "--virtual-time-budget=15000",  # let plotly finish drawing
            *args,
        ],
        capture_output=True,
        timeout=CHROMIUM_TIMEOUT_S,
        check=False,
    )


def _png_pixels(data: bytes) -> bytes:
    """The decompressed scanlines of a PNG (stdlib only)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    return zlib.decompress(idat)


def _section(dom: str, div_id: str) -> str:
    start = dom.index(f'id="{div_id}"')
    nxt = dom.find('id="plot-', start + 10)
    return dom[start : nxt if nxt != -1 else len(dom)]


def test_chromium_renders_both_plots(tmp_path: Path) -> None:
    binary = _chromium()
    if binary is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium; .ci/run does)")
    rep = report(LEVELS, SOURCES)
    page = write_html(rep, tmp_path / "bench.html")
    url = page.resolve().as_uri()

    shot = tmp_path / "shot.png"
    out = _run_chromium(binary, tmp_path, "--window-size=1200,2400", f"--screenshot={shot}", url)
    assert shot.is_file(), out.stderr.decode(errors="replace")[-2000:]
    pixels = _png_pixels(shot.read_bytes())
    assert len(set(pixels)) > 32, "the screenshot is blank"

    dom = _run_chromium(binary, tmp_path, "--dump-dom", url).stdout.decode("utf-8", "replace")
    for div_id in ("plot-throughput", "plot-acceptance"):
        tag = re.search(rf'<div\b[^>]*\bid="{div_id}"[^>]*>', dom)
        assert tag is not None, f"no #{div_id}"
        assert "js-plotly-plot" in tag.group(0), f"plotly did not draw #{div_id}"
    throughput = _section(dom, "plot-throughput")
    assert "main-svg" in throughput
    assert throughput.count('class="trace scatter') == 2  # baseline and speculative lines
    assert 'data-unformatted="baseline"' in throughput
    assert 'data-unformatted="speculative"' in throughput
    assert "output tokens/s against concurrency" in throughput
    acceptance = _section(dom, "plot-acceptance")
    assert "main-svg" in acceptance
    assert acceptance.count('class="trace bars') == 1
    assert acceptance.count('class="point"') == 3  # one bar per measured source
    for name in ("sharegpt", "xlam", "magicoder"):
        assert f'data-unformatted="{name}"' in acceptance
    assert 'data-unformatted="glaive"' not in acceptance  # not measured: no bar
