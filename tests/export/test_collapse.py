"""regen export and the ``collapsed`` flag (issue 43, part 5): decided across the latest answers
of each source, dropped by default and counted in stats.json like the stored flags,
``--drop-flags`` takes it or leaves it (then the answers' text is not read), ``--only-flagged``
lists the collapsed rows with the flag, and the thresholds come from the run's ``quality:``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from regen.core.result import TurnResult
from regen.core.sample import ATTEMPT_META, Message, Sample
from regen.engine.rows import build_turn_row
from regen.export import ExportSettings, export_run
from regen.export import select as export_select
from regen.quality import QualityConfig
from regen.store import RunDir, layout
from regen.store.schema import rows_to_table
from regen.template.render import Renderer

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"
#: what a collapsed target says to everything (24 words)
SAME = (
    "Thank you for your question! Here is a general overview of the topic and a few practical "
    "steps you can take to get started."
)


def _row(r: Renderer, sid: str, content: str, attempt: int = 0) -> dict:
    ask = [Message("user", f"Question {sid}: how does item {sid} work in practice?")]
    sample = Sample(id=sid, source=sid.split(":")[0], messages=ask, meta={ATTEMPT_META: attempt})
    res = TurnResult(content=content, reasoning="Thinking.", tool_calls=(), finish_reason="stop",
                     model="tiny", endpoint="http://127.0.0.1:9")  # fmt: skip
    row = build_turn_row(sample, 0, [m.to_openai() for m in ask], res, r)
    row.update(token_source="server", token_check="match")
    return row


def _own(sid: str) -> str:
    return f"About {sid}: " + " ".join(f"{sid}w{k}" for k in range(20))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """chat: 12 samples answered SAME (chat:0's later attempt answers on its own: 11 collapsed)
    and 6 on their own; few: 5 answered SAME (under the threshold of 8); short: 12 "Sure!"."""
    r = Renderer.from_dir(TOKENIZER)
    root = tmp_path_factory.mktemp("run")
    (root / "parts").mkdir()
    first = [_row(r, f"chat:{i}", SAME) for i in range(12)]
    first += [_row(r, f"chat:{i}", _own(f"chat:{i}")) for i in range(12, 18)]
    first += [_row(r, f"few:{i}", SAME) for i in range(5)]
    first += [_row(r, f"short:{i}", "Sure!") for i in range(12)]
    pq.write_table(rows_to_table(first), root / "parts" / "s1-00000.parquet", row_group_size=7)
    again = [_row(r, "chat:0", _own("chat:0"), attempt=1)]
    pq.write_table(rows_to_table(again), root / "parts" / "s2-00000.parquet")
    return root


def _export(run_dir: Path, out: Path, **settings: object):
    return export_run(
        RunDir.open(run_dir, create=False), str(out), ExportSettings.build(**settings)
    )


def test_collapsed_answers_are_dropped_by_default_and_counted(run_dir, tmp_path) -> None:
    stats = _export(run_dir, tmp_path / "o", format="conversations", shard_rows=0)
    assert stats.sources["chat"].dropped == {"flagged": 11, "superseded": 1}
    assert stats.sources["chat"].rows == 7  # 6 own answers and chat:0's new one
    assert stats.sources["few"].dropped == {} and stats.sources["short"].dropped == {}
    saved = json.loads((tmp_path / "o" / "stats.json").read_text())
    assert saved["flags"]["collapsed"]["rows"] == 11
    assert saved["sources"]["chat"]["flags"]["collapsed"]["rows"] == 11
    assert "collapsed" in saved["drop_flags"]
    shard = (tmp_path / "o" / "conversations-00000.jsonl").read_text()
    recs = [json.loads(x) for x in shard.splitlines()]
    assert all(rec["conversations"][-1]["content"] != SAME for rec in recs if "chat" in rec["id"])


def test_only_flagged_lists_the_collapsed_rows_with_the_flag(run_dir, tmp_path) -> None:
    stats = _export(
        run_dir, tmp_path / "f", format="conversations", drop_flags="collapsed", only_flagged=True
    )
    shard = (tmp_path / "f" / "conversations-00000.jsonl").read_text()
    recs = [json.loads(x) for x in shard.splitlines()]
    assert sorted(rec["id"] for rec in recs) == sorted(f"chat:{i}" for i in range(1, 12))
    assert all(rec["quality_flags"] == ["collapsed"] for rec in recs)
    assert stats.flags["collapsed"].rows == 11 and stats.rows_written == 11


def test_drop_flags_without_collapsed_keeps_them_and_reads_no_text(
    run_dir, tmp_path, monkeypatch
) -> None:
    def no_check(*a, **kw):  # type: ignore[no-untyped-def]
        raise AssertionError("the collapse check ran")

    monkeypatch.setattr(export_select, "CollapseFinder", no_check)
    stats = _export(run_dir, tmp_path / "k", drop_flags="repetition,empty_content", shard_rows=0)
    assert stats.flags == {} and stats.dropped == {"superseded": 1}


def test_thresholds_come_from_the_run_manifest(run_dir, tmp_path) -> None:
    strict = QualityConfig(collapse_min_prompts=12)
    assert _export(run_dir, tmp_path / "a", quality=strict).flags == {}
    near_five = QualityConfig(collapse_min_prompts=5)
    stats = _export(run_dir, tmp_path / "b", quality=near_five)
    assert stats.sources["few"].flags["collapsed"].rows == 5

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / layout.MANIFEST).write_text("quality:\n  collapse_min_prompts: 12\n")
    settings = ExportSettings.of_run(RunDir.open(copy, create=False))
    assert settings.quality.collapse_min_prompts == 12
    assert export_run(RunDir.open(copy, create=False), str(tmp_path / "c"), settings).flags == {}


def test_a_source_under_the_threshold_has_no_text_read(run_dir, tmp_path, monkeypatch) -> None:
    read: list[int] = []
    real = export_select.CollapseFinder.add

    def add(self, row, source, prompt, text):  # type: ignore[no-untyped-def]
        read.append(row)
        return real(self, row, source, prompt, text)

    monkeypatch.setattr(export_select.CollapseFinder, "add", add)
    _export(run_dir, tmp_path / "o", shard_rows=0)
    # chat (18 latest answers) and short (12) are read; few (5 < 8) is not
    assert len(read) == 18 + 12
