"""regen export and quality (issue 15): flagged rows dropped by policy with per-flag stats,
the latest attempt of a sample wins, --only-flagged lists what was dropped, and parts written
before the quality columns still export."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from regen.core.errors import ConfigError
from regen.core.result import TurnResult
from regen.core.sample import ATTEMPT_META, Message, Sample
from regen.engine.rows import build_turn_row
from regen.export import ExportSettings, export_run
from regen.store import RunDir
from regen.store.schema import ADDED_COLUMNS
from regen.store.schema import rows_to_table as table_of
from regen.template.render import Renderer

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"
ASK = [Message("user", "Please explain how a prefix cache speeds up decoding.")]


def rows_to_table(rows: list[dict]):
    """The rows as a server that returns its own ids makes them (token_source server,
    token_check match): these tests are about what export keeps for other reasons; locally
    rendered rows whose tokens are unproven have their own tests (test_unproven_* in
    tests/export/test_export.py)."""
    for row in rows:
        if row["token_source"] == "local":
            row.update(token_source="server", token_check="match")
    return table_of(rows)


def _res(reasoning: str, content: str, finish: str = "stop") -> TurnResult:
    return TurnResult(content=content, reasoning=reasoning, tool_calls=(), finish_reason=finish,
                      model="tiny", endpoint="http://127.0.0.1:9")  # fmt: skip


def _row(r: Renderer, sid: str, res: TurnResult, attempt: int = 0) -> dict:
    sample = Sample(id=sid, source=sid.split(":")[0], messages=[], meta={ATTEMPT_META: attempt})
    return build_turn_row(sample, 0, ASK, res, r)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = Renderer.from_dir(TOKENIZER)
    root = tmp_path_factory.mktemp("run")
    (root / "parts").mkdir()
    old = rows_to_table([_row(r, "old:1", _res("Think.", "A prefix cache reuses work."))])
    pq.write_table(old.drop_columns(ADDED_COLUMNS.names), root / "parts" / "s0-00000.parquet")
    first = [
        _row(r, "q:1", _res("I thought about it.", "")),  # empty_content
        _row(r, "q:2", _res("Fine.", "It keeps the keys and values of a shared prefix.")),
        _row(r, "q:3", _res("No.", "I'm sorry, but I can't help with that.")),  # refusal
    ]
    pq.write_table(rows_to_table(first), root / "parts" / "s1-00000.parquet")
    again = [_row(r, "q:1", _res("Again.", "It skips recomputing the shared prefix."), 1)]
    pq.write_table(rows_to_table(again), root / "parts" / "s2-00000.parquet")
    return root


def lines(out: Path, prefix: str) -> list[dict]:
    return [json.loads(x) for f in sorted(out.glob(f"{prefix}*.jsonl"))
            for x in f.read_text().splitlines()]  # fmt: skip


def test_the_latest_attempt_wins_and_the_default_keeps_refusals(run_dir, tmp_path) -> None:
    stats = export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "o"),
        ExportSettings.build(format="conversations", shard_rows=0),
    )
    recs = {r["id"]: r for r in lines(tmp_path / "o", "conversations-")}
    assert sorted(recs) == ["old:1", "q:1", "q:2", "q:3"]
    assert recs["q:1"]["conversations"][-1]["content"] == "It skips recomputing the shared prefix."
    assert stats.dropped == {"superseded": 1}
    assert stats.flags == {}  # the flagged attempt was superseded before the flag rule


def test_drop_flags_count_rows_and_tokens_per_source_and_flag(run_dir, tmp_path) -> None:
    stats = export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "o"),
        ExportSettings.build(drop_flags="all", shard_rows=0),
    )
    assert stats.rows_written == 3 and stats.dropped == {"flagged": 1, "superseded": 1}
    refusal = pq.read_table(run_dir / "parts" / "s1-00000.parquet").to_pylist()[2]
    assert refusal["quality_flags"] == ["refusal"]
    saved = json.loads((tmp_path / "o" / "stats.json").read_text())
    want = {"rows": 1, "tokens": refusal["num_tokens"], "loss_tokens": refusal["loss_tokens"]}
    assert saved["flags"] == {"refusal": want}
    assert saved["sources"]["q"]["flags"] == {"refusal": want}
    assert saved["sources"]["q"]["dropped"] == {"flagged": 1, "superseded": 1}
    assert saved["sources"]["old"]["rows"] == 1 and saved["sources"]["old"]["flags"] == {}
    assert saved["drop_flags"] == ["repetition", "empty_content", "reasoning_unclosed",
                                   "language_mismatch", "refusal", "bad_tool_call",
                                   "collapsed"]  # fmt: skip


def test_only_flagged_lists_the_dropped_rows_with_their_flags(run_dir, tmp_path) -> None:
    stats = export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "f"),
        ExportSettings.build(
            format="conversations", drop_flags="refusal,empty_content", only_flagged=True
        ),
    )
    recs = lines(tmp_path / "f", "conversations-")
    assert [(r["id"], r["turn"], r["attempt"], r["quality_flags"]) for r in recs] == [
        ("q:3", 0, 0, ["refusal"])
    ]  # q:1's empty answer was replaced by a clean attempt: not in the export, not listed
    assert recs[0]["conversations"][-1]["content"].startswith("I'm sorry")
    assert stats.only_flagged and stats.rows_written == 1
    assert stats.dropped == {"not_flagged": 3, "superseded": 1}
    assert stats.flags["refusal"].rows == 1


def test_bad_flag_arguments(run_dir, tmp_path) -> None:
    with pytest.raises(ConfigError, match="unknown flag 'loop'"):
        export_run(
            RunDir.open(run_dir, create=False),
            str(tmp_path / "x"),
            ExportSettings.build(drop_flags="loop"),
        )
    with pytest.raises(ConfigError, match="only-flagged"):
        export_run(
            RunDir.open(run_dir, create=False),
            str(tmp_path / "x"),
            ExportSettings.build(drop_flags="none", only_flagged=True),
        )


def test_cli_flags(run_dir, tmp_path, capsys) -> None:
    from regen.cli.main import main

    out = str(tmp_path / "c")
    assert main(["export", str(run_dir), "--out", out, "--only-flagged", "--drop-flags",
                 "all", "--format", "conversations"]) == 0  # fmt: skip
    assert "quality flags written: refusal 1 rows" in capsys.readouterr().out
    assert len(lines(tmp_path / "c", "conversations-")) == 1
    assert main(["export", str(run_dir), "--out", out, "--drop-flags", "nonsense"]) == 2
    assert "unknown flag 'nonsense'" in capsys.readouterr().err


def test_verify_accepts_a_part_from_before_the_columns(run_dir) -> None:
    from regen.store import RunDir
    from regen.store.verify import verify_run

    rep = verify_run(RunDir.open(run_dir), check_plan=False)
    assert [p for p in rep.problems if p.kind in ("schema", "duplicate")] == []
    assert any("1 part(s) written before the attempt and quality columns" in n for n in rep.notes)
    assert (rep.samples, rep.rows) == (4, 4)  # q:1 counted once, with its latest answer


def test_holdout_counts_each_sample_once_and_the_inspection_holds_nothing_out(
    run_dir, tmp_path
) -> None:
    stats = export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "h"),
        ExportSettings.build(holdout=1, drop_flags="none"),
    )
    held = [json.loads(x) for x in (tmp_path / "h" / "holdout.jsonl").read_text().splitlines()]
    assert stats.sources["q"].holdout_samples == 1 and len(held) == 1  # "old" keeps its one
    # the held-out sample's latest answer is out, a superseded row counted apart
    assert stats.dropped["superseded"] == 1
    assert stats.dropped["holdout"] == 1
    assert stats.rows_written == 5 - 1 - 1
    listed = export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "f"),
        ExportSettings.build(
            holdout=1, drop_flags="all", only_flagged=True, format="conversations"
        ),
    )
    assert listed.holdout_samples == 0 and not (tmp_path / "f" / "holdout.jsonl").exists()
    assert listed.rows_written == 1  # the refusal, held out or not
