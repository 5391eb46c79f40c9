"""The README's facts match what the commands print (issue 31, item 11): the bench figures in
the prose are the captured output's, the demo's export has one location, the host tools behind
skipped tests are named with how to see the skip reasons, and the cluster section says the
run directory is an absolute path on storage every node sees (its submit line is run for real
in tests/pipelines/test_readme_cluster.py)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def bench_capture() -> tuple[str, str]:
    """The README's bench paragraph (prose) and the captured output block under it."""
    start = README.index("5. **Bench it:**")
    block = re.search(r"```\n(   bench: .*?)```", README[start:], re.S)
    assert block is not None
    return flat(README[start : start + block.start()]), flat(block.group(1))


def test_the_bench_prose_quotes_the_captured_verdicts() -> None:
    prose, capture = bench_capture()
    verdict = re.compile(r"EAGLE3 draft: ([\d.]+)× at concurrency 1, ([\d.]+)× at 64")
    xlam = re.compile(r"acceptance on xlam ([\d.]+) vs ([\d.]+) elsewhere")
    for pattern in (verdict, xlam):
        said, shown = pattern.search(prose), pattern.search(capture)
        assert said is not None and shown is not None, pattern.pattern
        assert said.groups() == shown.groups(), (said.group(0), shown.group(0))


def test_the_demo_export_has_one_location() -> None:
    docs = [README, *(p.read_text(encoding="utf-8") for p in (REPO / "docs").glob("*.md"))]
    assert not any("runs/demo/export" in text for text in docs)
    assert "runs/demo-export" in README
    demo = (REPO / "regen" / "devkit" / "commands" / "demo.py").read_text(encoding="utf-8")
    assert '-export"' in demo  # its default: RUN_DIR-export, runs/demo-export


def test_the_skipping_host_tools_are_named_with_how_to_see_why() -> None:
    text = flat(README)
    assert "./scripts/test -rs" in text
    for tool in ("prometheus", "promtool", "Chromium", "tmux"):
        assert tool in text, tool
    skipping = [p for p in (REPO / "tests").rglob("test_*.py")
                if "pytest.skip(" in p.read_text(encoding="utf-8")]  # fmt: skip
    for path in skipping:
        src = path.read_text(encoding="utf-8")
        for tool in ("promtool", "prometheus", "Chromium", "tmux"):
            if f"no {tool}" in src or f"{tool} not installed" in src or f"{tool} is not" in src:
                assert str(path.relative_to(REPO)) in text, (tool, path)


def test_the_build_time_and_the_cluster_out_are_as_measured() -> None:
    text = flat(README)
    assert "trained in about a minute" not in text and "113 s" in text
    cluster = flat(README.split("## On a cluster", 1)[1].split("\n## ", 1)[0])
    assert "An absolute `--out` on storage every node sees" in cluster
