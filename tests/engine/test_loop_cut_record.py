"""A run keeps the loop cut it started with (run.json ``loop_cut``), whatever a later
session's manifest says; a run.json from before the cut records none, so such a run never
cuts. The manifest a session runs with (:func:`regen.store.run.with_recorded_cut`) is what
the driver hands the workers, whose clients cut or not by it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from _worker_config import client_for

from regen.manifest import load_manifest
from regen.quality.config import NO_LOOP_CUT, LoopCut
from regen.store import RunDir, layout
from regen.store.run import prepare_run, with_recorded_cut

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "manifests" / "demo.yaml"


def test_a_run_keeps_the_cut_it_started_with(tmp_path: Path, caplog) -> None:
    rd = RunDir.open(tmp_path / "run")
    rd.create()
    first = load_manifest(DEMO, ["quality.loop_cut.min_words=300"])
    info = prepare_run(rd, first, [])
    assert info.loop_cut == LoopCut(min_words=300)
    raw = json.loads((tmp_path / "run" / layout.RUN).read_text())
    assert raw["loop_cut"]["min_words"] == 300

    later = load_manifest(DEMO)  # the default cut: quality is not part of the fingerprint
    info = prepare_run(rd, later, [])
    assert info.loop_cut == LoopCut(min_words=300)  # prepare_run does not rewrite it
    with caplog.at_level(logging.WARNING):
        kept = with_recorded_cut(rd, info, later)
    assert kept.quality.loop_cut == LoopCut(min_words=300)
    assert "keeps it" in caplog.text
    assert kept.fingerprint() == later.fingerprint()
    client = client_for(kept)
    assert client.loop_cut == LoopCut(min_words=300)
    caplog.clear()
    assert with_recorded_cut(rd, info, kept) is kept and not caplog.text


def test_a_run_from_before_the_cut_never_cuts(tmp_path: Path) -> None:
    rd = RunDir.open(tmp_path / "run")
    rd.create()
    prepare_run(rd, load_manifest(DEMO), [])
    raw = json.loads((tmp_path / "run" / layout.RUN).read_text())
    del raw["loop_cut"]  # run.json as regen wrote it before the field
    (tmp_path / "run" / layout.RUN).write_text(json.dumps(raw))
    info = prepare_run(rd, load_manifest(DEMO), [])
    assert info.loop_cut == NO_LOOP_CUT
    kept = with_recorded_cut(rd, info, load_manifest(DEMO))
    assert not kept.quality.loop_cut.enabled


def test_a_client_without_the_cut_does_not_watch() -> None:
    m = load_manifest(DEMO, ["quality.loop_cut.enabled=false"])
    assert client_for(m).loop_cut is None
    on = load_manifest(DEMO)
    assert client_for(on).loop_cut == LoopCut()
