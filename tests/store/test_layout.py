"""regen.store.layout: the only place that spells a run-directory file name; records round-trip
and damaged files are named."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from regen.core.errors import RunDirError
from regen.store import RunDir, layout
from regen.store.layout import PartRecord, PlanEntry, PlanRecord, RunRecord

REPO = Path(__file__).resolve().parents[2]
#: library code: where no run-directory file name may be spelled outside store/layout.py
CODE_DIRS = ("regen", "monitor", "pipelines")
LAYOUT = REPO / "regen" / "store" / "layout.py"

_FILES = [
    "run.json",
    "manifest.yaml",
    "lock.json",
    "plan.json",
    "checks.json",
    "progress.json",
    "schedule.json",
    "stats.json",
    "draft_config.json",
    "prompts.jsonl",
    "command.json",
    "job.json",
    "preflight.json",
    "holdout.jsonl",
]
#: folders spelled alone or in a path
_DIRS = ("parts", "journal", "quarantine")
#: folders whose bare name is also an ordinary word or key ("export" the command, "failures"
#: a counter, "plan" the command): only caught in a path
_PREFIX_DIRS = ("export", "train", "failures", "plan")
#: a file name as a word (in a path, a message, ...)
FILE_RE = re.compile(r"(?<![\w.-])(" + "|".join(re.escape(f) for f in _FILES) + r")(?![\w-])")
#: a run-directory folder as a path component: exactly "parts", or "parts/...", ".../parts/..."
DIR_RE = re.compile(r"(^|/)(" + "|".join(_DIRS) + r")(/|$)")
PREFIX_RE = re.compile(r"(^|/)(" + "|".join(_PREFIX_DIRS) + r")/")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def spelled_names(source: str) -> list[tuple[int, str]]:
    """(line, literal) of every string literal in ``source`` (docstrings excepted) that spells
    a run-directory file or folder name."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if id(node) in docs:
            continue
        text = node.value
        if FILE_RE.search(text) or DIR_RE.search(text) or PREFIX_RE.search(text):
            out.append((node.lineno, text))
    return out


def test_the_detector_finds_every_way_of_spelling_a_name() -> None:
    bad = """
x = "progress.json"
y = f"{root}/parts/{name}"
z = "journal"
w = "see RUN_DIR/train/job.json"
v = "export/stats.json"
u = f"quarantine/{n}"
t = "failures/" + session
"""
    assert sorted(line for line, _ in spelled_names(bad)) == [2, 3, 4, 5, 6, 7, 8]
    fine = '''
"""A docstring may describe parts/ and progress.json."""
NAME = "export"
HELP = "write SpecForge shards"
key = "failures"
msg = "the parts of a run"
'''
    assert spelled_names(fine) == []


def scan_code() -> list[str]:
    """Every spelled run-directory name in the library code, as ``path:line: literal``."""
    found = []
    for d in CODE_DIRS:
        for path in sorted((REPO / d).rglob("*.py")):
            if path == LAYOUT:
                continue
            for line, text in spelled_names(path.read_text(encoding="utf-8")):
                found.append(f"{path.relative_to(REPO)}:{line}: {text!r}")
    return found


def test_no_run_directory_name_is_spelled_outside_the_layout() -> None:
    # In a fresh interpreter: CPython 3.11.7's ast.parse can raise "AST constructor recursion
    # depth mismatch" once other tests have run in the same process (fixed in 3.11.8).
    code = (
        f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "from test_layout import scan_code; print(json.dumps(scan_code()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    found = json.loads(out.stdout)
    assert found == [], "use regen.store.layout instead:\n" + "\n".join(found)


def test_the_layout_docstring_lists_every_name() -> None:
    doc = ast.get_docstring(ast.parse(LAYOUT.read_text(encoding="utf-8"))) or ""
    for name in (*_FILES, *_DIRS, *_PREFIX_DIRS):
        assert name in doc, name


def test_records_round_trip(tmp_path: Path) -> None:
    rd = RunDir.open(tmp_path / "run")
    run = RunRecord(name="n", fingerprint="f", model="m", created_at=1.0, regen_version="0.1")
    layout.RUN_FILE.write(rd, run)
    assert layout.RUN_FILE.read(rd) == run
    plan = PlanRecord(sources={"a": PlanEntry(total=3, regenerate=True, regenerate_todo=2)})
    layout.PLAN_FILE.write(rd, plan)
    assert layout.PLAN_FILE.read(rd) == plan
    rec = PartRecord(stem="S-00000", rows=2, samples=1, bytes=10, sha256="0" * 64)
    layout.part_record_file("S-00000").write(rd, rec)
    assert layout.part_record_file("S-00000").read(rd) == rec
    assert (tmp_path / "run" / "parts" / "_S-00000.json").exists()
    assert layout.LOCK_FILE.read(rd) is None  # missing reads as None


def test_a_damaged_record_is_an_error_naming_the_file(tmp_path: Path) -> None:
    rd = RunDir.open(tmp_path / "run")
    rd.write_bytes_atomic(layout.RUN, b'{"name": "n", "fingerprint": 3}')
    with pytest.raises(RunDirError, match=r"run\.json is damaged: fingerprint"):
        layout.RUN_FILE.read(rd)
    rd.write_bytes_atomic(layout.PLAN, b"not json")
    with pytest.raises(RunDirError, match=r"plan\.json is damaged"):
        layout.PLAN_FILE.read(rd)
    rd.write_bytes_atomic(layout.SCHEDULE, b"{torn")  # an estimate: ignored, not an error
    assert layout.SCHEDULE_FILE.read(rd) is None


def test_the_atomic_writer_leaves_nothing_on_error(tmp_path: Path) -> None:
    rd = RunDir.open(tmp_path / "run")
    rd.write_bytes_atomic("x.bin", b"old")
    with pytest.raises(ValueError), rd.atomic_writer("x.bin") as f:
        f.write(b"half")
        raise ValueError("boom")
    assert rd.read_bytes("x.bin") == b"old"
    assert rd.list("", include_temp=True) == ["x.bin"]
