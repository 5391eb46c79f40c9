"""A run started before history tool-call arguments rendered as objects keeps rendering them as
it started (as the request's JSON text), and says once that a new run would render otherwise.

run.json records the render a run started with (``render``: a new run ``objects``; a run.json
of before holds none and reads ``strings``); the driver hands the actors' row builder that
(:class:`regen.template.render.RenderSetup`), and says so once when it is not a new run's.
"""

from __future__ import annotations

import json
from pathlib import Path

from regen.core.result import TurnResult
from regen.core.sample import Message, Sample, ToolCall
from regen.engine.inputs import row_settings
from regen.engine.turns import DoneTurn
from regen.engine.worker import default_row_builder
from regen.manifest import load_manifest
from regen.store import RunDir, layout
from regen.store.run import prepare_run
from regen.template.render import RenderSetup

REPO = Path(__file__).resolve().parents[2]
QWEN3 = REPO / "manifests" / "demo-qwen3.yaml"
#: compact arguments: Qwen3's template writes a string as it is and an object with tojson
COMPACT = '{"city":"Oslo","n":1.50}'


def test_a_new_run_records_objects_and_one_of_before_reads_strings(tmp_path: Path) -> None:
    rd = RunDir.open(tmp_path / "run")
    rd.create()
    info = prepare_run(rd, load_manifest(QWEN3), [])
    assert info.render == "objects"
    raw = json.loads((tmp_path / "run" / layout.RUN).read_text())
    assert raw["render"] == "objects"
    del raw["render"]  # run.json as regen wrote it before the field
    (tmp_path / "run" / layout.RUN).write_text(json.dumps(raw))
    again = prepare_run(rd, load_manifest(QWEN3), [])
    assert again.render == "strings"  # kept: prepare_run does not rewrite what a run recorded
    assert "render" not in json.loads((tmp_path / "run" / layout.RUN).read_text())


def rows_with(setup: RenderSetup) -> dict:
    build = default_row_builder(row_settings(load_manifest(QWEN3), setup))
    history = [
        Message("user", "Weather in Oslo?"),
        Message("assistant", "", tool_calls=(ToolCall("c0", "get_weather", COMPACT),)),
        Message("tool", "12 C", tool_call_id="c0"),
    ]
    sample = Sample(id="s:1", source="s", messages=[*history, Message("assistant", "x")])
    result = TurnResult(content="It is 12 C.", reasoning="Done.", tool_calls=(),
                        finish_reason="stop", model="m", endpoint="e", engine="vllm")  # fmt: skip
    request = [m.to_openai() for m in history]
    return build(sample, [DoneTurn(0, request, result)])[0]


def test_the_row_builder_renders_as_the_run_recorded() -> None:
    old = rows_with(RenderSetup(arguments="strings"))["text"]
    new = rows_with(RenderSetup())["text"]
    assert COMPACT in old  # the request's JSON text, as regen rendered before
    assert '{"city": "Oslo", "n": 1.5}' in new and COMPACT not in new  # the object, as vLLM
