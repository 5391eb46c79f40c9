"""Every family's rows, exported by ``regen export``, are accepted whole by SpecForge 0.2.0.

Per family: a tokenizer holding its special tokens (the committed tiny one where it has one,
else the tiny Kimi BPE with the family's tokens added) and its REAL chat template
(regen/devkit/tokenizers/templates/, Kimi's own for Kimi); the demo manifest's samples (tool-call
sources included) answered in the family's format (reasoning where it reasons, the sample's
own tool calls where tools are declared) and built into rows by regen's row builder; the rows
written as a part of a run directory, exported, and read by SpecForge's own
``prepare_prompt_tasks``: 100% accepted, ids and masks unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _families import TEMPLATES, TINY, family_tokenizer, has_template

from regen.core.errors import TemplateError
from regen.core.result import TurnResult
from regen.core.sample import Sample, ToolCall
from regen.engine.rows import build_rows
from regen.export import ExportSettings, export_run
from regen.manifest import load_manifest
from regen.sources import read_samples, source_set
from regen.store import RunDir
from regen.store.completed import CompletedSample
from regen.store.parts import write_part
from regen.targets import FAMILIES, Family
from regen.template.render import Renderer
from regen.template.tokenizer import load_tokenizer
from regen.train.preflight import prompt_tasks

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "manifests" / "demo.yaml"


def answer(family: Family, sample: Sample) -> TurnResult:
    """The family's answer to the sample's first request: its own tool calls where tools are
    declared and the original answer called them, else a sentence; reasoning where the
    family reasons."""
    first = next(m for m in sample.messages if m.role == "assistant")
    calls = tuple(ToolCall(c.id, c.name, c.arguments) for c in first.tool_calls)
    if not sample.tools:
        calls = ()
    return TurnResult(
        content="" if calls else "Here is the answer.",
        reasoning="Let me think about it." if family.think else None,
        tool_calls=calls, finish_reason="tool_calls" if calls else "stop",
        model=None, endpoint=None,
    )  # fmt: skip


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    manifest = load_manifest(DEMO)
    out = [s for s in read_samples(source_set(manifest)) if s.mode == "regenerate"]
    assert any(s.tools for s in out)
    return out


@pytest.mark.parametrize("name", sorted(n for n, f in FAMILIES.items() if has_template(f)
                                         or f.encodes_prompts))  # fmt: skip
def test_specforge_accepts_every_row_of_the_familys_export(
    name: str, samples: list[Sample], tmp_path: Path
) -> None:
    family = FAMILIES[name]
    path = family_tokenizer(family, tmp_path)
    renderer = Renderer(load_tokenizer(path), family.template_kwargs(True), family)
    done: list[CompletedSample] = []
    for sample in samples:
        request = list(sample.messages[: next(i for i, m in enumerate(sample.messages)
                                              if m.role == "assistant")])  # fmt: skip
        if not any(m.role == "user" for m in request):
            continue
        try:
            rows = build_rows(sample, [(0, request, answer(family, sample))], renderer)
        except TemplateError:  # a template that refuses this conversation's shape
            continue
        done.append(CompletedSample(sample.id, sample.source, rows))
    tool_rows = sum(1 for c in done if json.loads(c.rows[0]["tool_calls"]))
    assert len(done) >= 30 and tool_rows >= 5, (len(done), tool_rows)
    assert {r["family"] for c in done for r in c.rows} == {name}
    rd = RunDir.open(tmp_path / "run")
    rd.create()
    write_part(rd, "part-00000", done)
    out = tmp_path / "export"
    # local rows without a server count: unproven, kept here (the contract is every row)
    stats = export_run(
        rd,
        str(out),
        ExportSettings.build(
            shard_rows=0, drop_flags="none", drop_truncated=False, keep_unproven=True
        ),
        check=False,
    )
    lines = (out / "shard-00000.jsonl").read_text().splitlines()
    assert stats.rows_written == len(lines) == len(done)
    tasks = prompt_tasks(out / "shard-00000.jsonl", max_length=1_000_000)
    assert len(tasks) == len(lines)  # 100 % accepted
    assert [t["payload"] for t in tasks] == [json.loads(line) for line in lines]
    # every answer ends with one of the family's end tokens
    assert all(json.loads(line)["input_ids"][-1] in renderer.end_ids for line in lines)


#: families whose models publish no chat template and whose engines have no encoder of their
#: own: regen renders them only with the template the target ships
WITHOUT_TEMPLATE = {"minimax_m3"}


def test_every_family_has_a_real_template_here() -> None:
    """The families without a committed tiny tokenizer take their template from here (a family
    the engines encode in Python needs none: its encoder is regen's)."""
    for name, fam in FAMILIES.items():
        if name not in WITHOUT_TEMPLATE and not fam.encodes_prompts:
            assert name in TINY or (TEMPLATES / f"{name}.jinja").is_file(), name
