"""regen export: dedup, drops, deterministic shuffle, shards, native byte identity, SpecForge."""

from __future__ import annotations

import argparse
import json
import shutil
import typing
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from regen.core.errors import ConfigError
from regen.core.result import TurnResult
from regen.core.sample import Message, Sample, ToolCall
from regen.engine.rows import build_turn_row, native_row
from regen.export import ExportSettings, export_run
from regen.quality import DEFAULT_DROP_FLAGS
from regen.sources.native import VocabInfo, validate_native
from regen.store import RunDir, layout
from regen.store.schema import rows_to_table as table_of
from regen.targets.kimi import KIMI
from regen.template.render import Renderer

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"
NATIVE = REPO / "manifests" / "demo" / "kimi_native.jsonl"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def rows_to_table(rows: list[dict]):
    """The rows as a server that returns its own ids makes them (token_source server,
    token_check match): these tests are about what export keeps for other reasons; locally
    rendered rows whose tokens are unproven have their own tests (test_unproven_* in
    tests/export/test_export.py)."""
    for row in rows:
        if row["token_source"] == "local":
            row.update(token_source="server", token_check="match")
    return table_of(rows)


def _res(reasoning: str | None, content: str, finish: str = "stop", calls=()) -> TurnResult:
    return TurnResult(
        content=content,
        reasoning=reasoning,
        tool_calls=tuple(calls),
        finish_reason=finish,
        model="tiny",
        endpoint="http://127.0.0.1:9",
    )


def _native_samples() -> list[Sample]:
    vocab = VocabInfo.from_dir(TOKENIZER, KIMI)
    out, seen = [], set()
    for line in NATIVE.read_text().splitlines():
        r = json.loads(line)
        s = Sample(
            id=f"native:{r['id']}",
            source="native",
            messages=[],
            mode="native",
            input_ids=r["input_ids"],
            loss_mask=r["loss_mask"],
        )
        if validate_native(s, vocab) is None and s.id not in seen:
            seen.add(s.id)
            out.append(s)
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with two parts, a stray temp part, and every kind of row."""
    r = Renderer.from_dir(TOKENIZER)
    root = tmp_path_factory.mktemp("run")
    chat = Sample(id="chat:1", source="chat", messages=[], tools=None)
    u1, u2 = Message("user", "Pick a number."), Message("user", "Double it.")
    a1 = Message("assistant", "Seven.", reasoning="Choose seven.")
    rows_a = [
        build_turn_row(chat, 0, [u1], _res("Choose seven.", "Seven."), r),
        build_turn_row(chat, 1, [u1, a1, u2], _res("Times two.", "Fourteen."), r),
        build_turn_row(
            Sample(id="chat:2", source="chat", messages=[]),
            0,
            [Message("user", "Write a long story.")],
            _res("Once upon", "", finish="length"),
            r,
        ),
        build_turn_row(
            Sample(id="tools:1", source="tools", messages=[], tools=TOOLS),
            0,
            [Message("user", "Weather in Oslo?")],
            _res(
                "Call it.",
                "",
                "tool_calls",
                [ToolCall("functions.get_weather:0", "get_weather", '{"city": "Oslo"}')],
            ),
            r,
        ),
        build_turn_row(
            Sample(id="chat:3", source="chat", messages=[]),
            0,
            [Message("user", "Explain " + "very " * 60 + "briefly.")],
            _res("Long prompt.", "Ok."),
            r,
        ),
    ]
    natives = [native_row(s) for s in _native_samples()]
    zero = native_row(
        Sample(id="native:zero", source="native", messages=[], input_ids=[1, 2], loss_mask=[0, 0])
    )
    rows_b = [*natives, zero, dict(rows_a[0])]  # rows_a[0] again: a duplicate (sample, turn)
    (root / "parts").mkdir()
    pq.write_table(rows_to_table(rows_a), root / "parts" / "s1-00000.parquet")
    pq.write_table(rows_to_table(rows_b), root / "parts" / "s1-00001.parquet")
    (root / "parts" / ".tmp-s1-00002.parquet").write_bytes(b"half a file")
    (root / "manifest.yaml").write_text("name: x\nexport:\n  seed: 5\n  shard_rows: 3\n")
    return root


def _lines(out: Path, prefix: str = "shard-") -> list[str]:
    files = sorted(out.glob(f"{prefix}*.jsonl"))
    return [line for f in files for line in f.read_text().splitlines()]


def test_pretokenized_export_numbers(run_dir: Path, tmp_path: Path) -> None:
    stats = export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "out"),
        ExportSettings.build(shard_rows=0),
    )
    assert stats.parts == 2
    assert stats.rows_read == 5 + 4 + 1 + 1
    # the cut row is all reasoning: flagged reasoning_unclosed (checked before truncation)
    assert stats.dropped == {"duplicate": 1, "flagged": 1, "no_loss_tokens": 1}
    assert list(stats.flags) == ["reasoning_unclosed"] and stats.flags["reasoning_unclosed"].rows
    assert stats.rows_written == 8
    assert stats.sources["chat"].rows == 3 and stats.sources["chat"].truncated_seen == 1
    assert stats.sources["native"].rows == 4
    assert stats.sources["tools"].rows == 1
    assert stats.token_source == {"server": 4, "native": 4}
    lines = _lines(tmp_path / "out")
    assert len(lines) == 8 and [s["file"] for s in stats.shards] == ["shard-00000.jsonl"]
    recs = [json.loads(x) for x in lines]
    assert all(list(rec) == ["input_ids", "loss_mask"] for rec in recs)
    assert stats.tokens == sum(len(rec["input_ids"]) for rec in recs)
    assert stats.loss_tokens == sum(sum(rec["loss_mask"]) for rec in recs)
    saved = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert saved["rows_written"] == 8 and saved["dropped"] == stats.dropped
    assert 0 < saved["mask_coverage"] < 1
    assert saved["sources"]["chat"]["dropped"] == {"duplicate": 1, "flagged": 1}
    assert saved["sources"]["chat"]["flags"] == {
        "reasoning_unclosed": {"rows": 1, "tokens": 48, "loss_tokens": 7}
    }
    assert saved["drop_flags"] == list(DEFAULT_DROP_FLAGS) and saved["only_flagged"] is False


def test_native_rows_come_out_byte_identical(run_dir: Path, tmp_path: Path) -> None:
    export_run(RunDir.open(run_dir, create=False), str(tmp_path / "out"))
    out = set(_lines(tmp_path / "out"))
    natives = _native_samples()
    assert len(natives) == 4
    for line in NATIVE.read_text().splitlines():
        rec = json.loads(line)
        if f"native:{rec['id']}" not in {s.id for s in natives}:
            continue
        expected = json.dumps(
            {"input_ids": rec["input_ids"], "loss_mask": rec["loss_mask"]}, separators=(",", ":")
        )
        assert expected in out
        # and the exact bytes of the input file's arrays
        assert line.split('"input_ids":', 1)[1].rstrip("}") == expected.split('"input_ids":', 1)[
            1
        ].rstrip("}")


def test_shuffle_is_deterministic_and_independent_of_part_order(
    run_dir: Path, tmp_path: Path
) -> None:
    export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "a"),
        ExportSettings.build(seed=3, shard_rows=0),
    )
    export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "b"),
        ExportSettings.build(seed=3, shard_rows=0),
    )
    export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "c"),
        ExportSettings.build(seed=4, shard_rows=0),
    )
    renamed = tmp_path / "renamed"
    shutil.copytree(run_dir, renamed)
    parts = renamed / "parts"
    (parts / "s1-00000.parquet").rename(parts / "z-late.parquet")
    export_run(
        RunDir.open(renamed, create=False),
        str(tmp_path / "d"),
        ExportSettings.build(seed=3, shard_rows=0),
    )
    a, b, c, d = (_lines(tmp_path / x) for x in "abcd")
    assert a == b == d
    assert a != c and sorted(a) == sorted(c)


def test_shards_are_slices_of_one_order(run_dir: Path, tmp_path: Path) -> None:
    one = export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "one"),
        ExportSettings.build(shard_rows=0),
    )
    three = export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "three"),
        ExportSettings.build(shard_rows=3),
    )
    assert [s["rows"] for s in three.shards] == [3, 3, 2]
    assert _lines(tmp_path / "three") == _lines(tmp_path / "one")
    assert one.rows_written == three.rows_written
    # a re-export with fewer shards removes the stale ones
    export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "three"),
        ExportSettings.build(shard_rows=0),
    )
    assert sorted(p.name for p in (tmp_path / "three").glob("*.jsonl")) == ["shard-00000.jsonl"]


def test_keep_truncated_and_max_length(run_dir: Path, tmp_path: Path) -> None:
    flagged = export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "k"),
        ExportSettings.build(drop_truncated=False),
    )
    assert flagged.rows_written == 8 and flagged.dropped["flagged"] == 1  # cut in its reasoning
    kept = export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "k"),
        ExportSettings.build(drop_truncated=False, drop_flags="none"),
    )
    assert kept.rows_written == 9 and "truncated" not in kept.dropped
    all_lens = sorted(len(json.loads(x)["input_ids"]) for x in _lines(tmp_path / "k"))
    limit = all_lens[-2]  # drops exactly the longest row
    assert all_lens[-1] > limit
    short = export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "s"),
        ExportSettings.build(drop_truncated=False, max_length=limit, drop_flags=()),
    )
    assert short.dropped["too_long"] == 1 and short.rows_written == 8
    assert all(len(json.loads(x)["input_ids"]) <= limit for x in _lines(tmp_path / "s"))


def test_specforge_accepts_every_row_with_masks_unchanged(run_dir: Path, tmp_path: Path) -> None:
    from regen.train.preflight import prompt_tasks

    stats = export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "out"),
        ExportSettings.build(shard_rows=0),
    )
    path = tmp_path / "out" / "shard-00000.jsonl"
    tasks = prompt_tasks(path, max_length=1_000_000)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(tasks) == len(lines) == stats.rows_written
    for task, rec in zip(tasks, lines, strict=True):
        assert task["payload"] == rec


def test_conversations_variant(run_dir: Path, tmp_path: Path) -> None:
    stats = export_run(
        RunDir.open(run_dir, create=False),
        str(tmp_path / "c"),
        ExportSettings.build(format="conversations", shard_rows=0),
    )
    recs = {r["id"]: r for r in map(json.loads, _lines(tmp_path / "c", "conversations-"))}
    assert sorted(recs) == ["chat:1", "chat:3", "tools:1"]
    assert stats.dropped["not_convertible"] == 4 and stats.dropped["earlier_turn"] == 1
    conv = recs["chat:1"]["conversations"]
    assert [m["role"] for m in conv] == ["user", "assistant", "user", "assistant"]
    assert conv[1]["reasoning_content"] == "Choose seven."  # history as the request sent it
    assert conv[-1] == {
        "role": "assistant",
        "content": "Fourteen.",
        "reasoning_content": "Times two.",
    }
    assert recs["tools:1"]["tools"] == TOOLS
    assert recs["tools:1"]["conversations"][-1]["tool_calls"][0]["id"] == (
        "functions.get_weather:0"
    )
    assert "tools" not in recs["chat:1"]


def test_bad_arguments(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        export_run(
            RunDir.open(run_dir, create=False),
            str(tmp_path / "o"),
            ExportSettings.build(format="csv"),
        )  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        export_run(
            RunDir.open(run_dir, create=False),
            str(tmp_path / "o"),
            ExportSettings.build(shard_rows=-1),
        )


def test_cli_uses_manifest_defaults_and_reports_errors(run_dir: Path, tmp_path: Path) -> None:
    from regen.cli.main import main

    assert main(["export", str(run_dir), "--out", str(tmp_path / "o")]) == 0
    stats = json.loads((tmp_path / "o" / "stats.json").read_text())
    assert (stats["seed"], stats["shard_rows"], len(stats["shards"])) == (5, 3, 3)
    assert main(["export", str(run_dir), "--out", str(tmp_path / "o"), "--keep-truncated",
                 "--drop-flags", "none"]) == 0  # fmt: skip
    assert json.loads((tmp_path / "o" / "stats.json").read_text())["rows_written"] == 9
    assert main(["export", str(tmp_path / "missing"), "--out", str(tmp_path / "o2")]) == 2


def test_each_flag_of_regen_export_is_a_setting_by_its_name(run_dir: Path, tmp_path: Path) -> None:
    """The CLI hands the flags given to the settings by their names (no second list): every
    flag's dest is a field of ExportSettings, and each flag given decides its setting."""
    from regen.cli.export import add_arguments
    from regen.cli.main import main
    from regen.store.layout import ExportFormat

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    dests = {a.dest for a in parser._actions} - {"help", "run_dir", "out"}
    assert dests <= set(ExportSettings.model_fields), dests - set(ExportSettings.model_fields)
    fmt = next(a for a in parser._actions if a.dest == "format")
    assert tuple(fmt.choices) == typing.get_args(ExportFormat)
    flags = ["--seed", "9", "--shard-rows", "0", "--max-length", "4000", "--holdout", "0",
             "--drop-flags", "repetition", "--keep-unproven", "--keep-truncated",
             "--format", "conversations"]  # fmt: skip
    assert main(["export", str(run_dir), "--out", str(tmp_path / "o"), *flags]) == 0
    stats = json.loads((tmp_path / "o" / "stats.json").read_text())
    want = {"seed": 9, "shard_rows": 0, "max_length": 4000, "holdout": 0,
            "drop_flags": ["repetition"], "keep_unproven": True, "drop_truncated": False,
            "format": "conversations"}  # fmt: skip
    assert {k: stats[k] for k in want} == want


def test_stats_json_records_the_settings_in_its_key_order(run_dir: Path, tmp_path: Path) -> None:
    """stats.json records every setting of layout.ExportChoices as the export ran with it,
    its keys in layout.EXPORT_STATS_KEYS' order (the file's order since it was made), a
    key of another version's after them; one without drop_flags was made before flags."""
    settings = ExportSettings.build(seed=2, shard_rows=0, holdout=1, setting=None)
    stats = export_run(RunDir.open(run_dir, create=False), str(tmp_path / "o"), settings)
    saved = json.loads((tmp_path / "o" / "stats.json").read_text())
    assert list(saved) == list(layout.EXPORT_STATS_KEYS)
    assert set(layout.EXPORT_STATS_KEYS) == set(layout.ExportStats.model_fields)
    for name in layout.ExportChoices.model_fields:
        assert saved[name] == getattr(settings, name), name
    saved["future_key"] = 1
    del saved["drop_flags"]
    again = layout.EXPORT_STATS_FILE.parse(json.dumps(saved).encode())
    assert again.drop_flags == [] and list(json.loads(layout.dump_json(again)))[-1] == "future_key"
    assert stats.rows_written == saved["rows_written"]


def test_stats_count_every_token_check(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Local-row count checks and render flags land in stats.json and the CLI's warning."""
    from regen.cli.main import main

    r = Renderer.from_dir(TOKENIZER)
    req = [Message("user", "Hi")]
    n = len(r.render_turn(req, None, reasoning="R.", content="A.").response_ids)

    def row(sid: str, reasoning: str | None, content: str, completion: int | None) -> dict:
        res = _res(reasoning, content)
        res.completion_tokens = completion
        return build_turn_row(Sample(id=sid, source="s", messages=[]), 0, req, res, r)

    rows = [
        row("s:1", "R.", "A.", n),
        row("s:2", "R.", "A.", n + 5),
        row("s:3", None, "A.", None),
        row("s:4", "R.", "A.", None),
    ]
    (tmp_path / "run" / "parts").mkdir(parents=True)
    pq.write_table(table_of(rows), tmp_path / "run" / "parts" / "p.parquet")
    stats = export_run(RunDir.open(tmp_path / "run", create=False), str(tmp_path / "out"))
    # a local row with no server count cannot be checked at all: counted, never silent
    expected = {"count_match": 1, "count_mismatch": 1, "think_inserted": 1, "count_unknown": 1}
    assert stats.token_check == expected and stats.token_check_problems == 3
    saved = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert saved["token_check"] == expected and saved["token_check_problems"] == 3
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "o2")]) == 0
    assert "3 row(s) failed the token check" in capsys.readouterr().out


def test_heavy_columns_are_streamed_per_row_group(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole parts are read for key columns only; ids/masks one row group at a time, once."""
    import regen.export.settings as export_settings
    import regen.export.write as export_write

    expected = {}
    for fmt in ("pretokenized", "conversations"):
        export_run(
            RunDir.open(run_dir, create=False),
            str(tmp_path / f"ref-{fmt}"),
            ExportSettings.build(seed=2, shard_rows=0, format=fmt),
        )
        expected[fmt] = tmp_path / f"ref-{fmt}" / f"{layout.SHARD_PREFIX[fmt]}00000.jsonl"

    small = tmp_path / "small"
    shutil.copytree(run_dir, small)
    for part in (small / "parts").glob("s1-*.parquet"):
        pq.write_table(pq.read_table(part), part, row_group_size=2)  # several row groups

    full_reads: list[list[str]] = []
    group_reads: list[tuple[int, tuple[str, ...]]] = []
    real_read, real_group = pq.ParquetFile.read, pq.ParquetFile.read_row_group

    def read(self, columns=None, **kw):  # type: ignore[no-untyped-def]
        full_reads.append(list(columns or []))
        return real_read(self, columns=columns, **kw)

    def read_row_group(self, i, columns=None, **kw):  # type: ignore[no-untyped-def]
        group_reads.append((i, tuple(columns or ())))
        return real_group(self, i, columns=columns, **kw)

    def no_read_table(*a, **kw):  # type: ignore[no-untyped-def]
        raise AssertionError("export must not load whole parts")

    monkeypatch.setattr(pq.ParquetFile, "read", read)
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", read_row_group)
    monkeypatch.setattr(pq, "read_table", no_read_table)
    monkeypatch.setattr(export_write, "WINDOW_ROWS", 2)  # many spill buckets
    for fmt in ("pretokenized", "conversations"):
        full_reads.clear()
        group_reads.clear()
        out = tmp_path / f"stream-{fmt}"
        export_run(
            RunDir.open(small, create=False),
            str(out),
            ExportSettings.build(seed=2, shard_rows=0, format=fmt),
        )
        got = out / f"{layout.SHARD_PREFIX[fmt]}00000.jsonl"
        assert got.read_bytes() == expected[fmt].read_bytes()
        assert full_reads and all(
            not {"input_ids", "loss_mask", "messages"} & set(c) for c in full_reads
        )
        assert group_reads and all(c == export_settings.DATA_COLUMNS[fmt] for _, c in group_reads)
        assert len(group_reads) <= 3 + 3  # at most once per row group (2 parts of 3 groups)


# ---- --holdout N: held-out samples for regen bench --------------------------------------------


def _holdout_rows(r: Renderer, chats: int, tools: int) -> list[dict]:
    """``chats`` one- or two-turn chat samples and ``tools`` tool-calling samples."""
    rows = []
    for i in range(chats):
        s = Sample(id=f"chat:{i}", source="chat", messages=[])
        sys_msg, u1 = Message("system", "Be brief."), Message("user", f"Question {i}?")
        rows.append(build_turn_row(s, 0, [sys_msg, u1], _res("Think.", f"Answer {i}."), r))
        if i % 2:  # a second turn: its request holds the first answer
            a1 = Message("assistant", f"Answer {i}.", reasoning="Think.")
            u2 = Message("user", "And then?")
            rows.append(build_turn_row(s, 1, [sys_msg, u1, a1, u2], _res("More.", "Then."), r))
    for i in range(tools):
        s = Sample(id=f"tools:{i}", source="tools", messages=[], tools=TOOLS)
        call = ToolCall("functions.get_weather:0", "get_weather", f'{{"city": "C{i}"}}')
        rows.append(
            build_turn_row(
                s, 0, [Message("user", f"Weather {i}?")], _res("Call.", "", "tool_calls", [call]), r
            )
        )
    return rows


@pytest.fixture(scope="module")
def holdout_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """chat: 10 samples (5 with two turns), tools: 3 samples, native rows; two parts."""
    r = Renderer.from_dir(TOKENIZER)
    root = tmp_path_factory.mktemp("holdout-run")
    rows = _holdout_rows(r, chats=10, tools=3) + [native_row(s) for s in _native_samples()]
    (root / "parts").mkdir()
    half = len(rows) // 2
    pq.write_table(rows_to_table(rows[:half]), root / "parts" / "s1-00000.parquet")
    pq.write_table(rows_to_table(rows[half:]), root / "parts" / "s1-00001.parquet")
    manifest = {
        "name": "holdout-test",
        "target": {"model": "moonshotai/Kimi-K2.5", "tokenizer": str(TOKENIZER)},
        "sampling": {"temperature": 0.0, "seed": 3},
        "sources": [
            {"name": "chat", "adapter": "sharegpt", "path": "a.jsonl"},
            {"name": "tools", "adapter": "xlam", "path": "b.jsonl"},
        ],
        "export": {"seed": 7, "holdout": 2},
    }
    (root / "manifest.yaml").write_text(json.dumps(manifest))
    return root


def test_holdout_keeps_n_samples_per_source_out_of_the_shards(
    holdout_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from regen.export.holdout import holdout_rank
    from regen.store.holdout import read_prompts

    out = tmp_path / "out"
    stats = export_run(
        RunDir.open(holdout_run, create=False),
        str(out),
        ExportSettings.build(seed=7, holdout=2, format="conversations"),
    )
    # per source the 2 samples of smallest rank; tools has 3 samples: only 1 (half stays)
    chat_ids = [f"chat:{i}" for i in range(10)]
    want_chat = sorted(chat_ids, key=lambda s: (holdout_rank(7, s), s))[:2]
    want_tools = sorted((f"tools:{i}" for i in range(3)), key=lambda s: holdout_rank(7, s))[:1]
    assert "source tools has 3 samples: holding out 1, not 2" in caplog.text
    prompts = read_prompts(out / layout.HOLDOUT)
    assert [p.sample_id for p in prompts] == want_chat + want_tools
    held = set(want_chat + want_tools)
    # none of their turns is in the shards; every other sample is
    written = {json.loads(line)["id"] for line in _lines(out, "conversations-")}
    assert written.isdisjoint(held)
    assert written == (set(chat_ids) | {f"tools:{i}" for i in range(3)}) - held
    held_rows = sum(2 if int(s.split(":")[1]) % 2 and s.startswith("chat") else 1 for s in held)
    assert stats.dropped["holdout"] == held_rows
    assert (stats.holdout, stats.holdout_samples, stats.holdout_file) == (2, 3, layout.HOLDOUT)
    assert stats.sources["chat"].holdout_samples == 2
    assert stats.sources["tools"].holdout_samples == 1
    assert "native" not in {p.source for p in prompts}  # nothing to send for native rows
    on_disk = json.loads((out / layout.EXPORT_STATS).read_text())
    assert on_disk["holdout"] == 2 and on_disk["dropped"]["holdout"] == held_rows
    assert on_disk["sources"]["chat"]["holdout_samples"] == 2
    # each prompt is the first turn's request as the run sent it, ready to send
    for p in prompts:
        assert p.turn == 0 and p.messages[-1]["role"] == "user"
        if p.source == "chat":
            n = p.sample_id.split(":")[1]
            assert p.messages == [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"Question {n}?"},
            ]
            assert p.tools is None
        else:
            assert p.tools == TOOLS and p.messages[0]["content"].startswith("Weather ")


def test_holdout_is_deterministic_by_seed_whatever_the_part_order(
    holdout_run: Path, tmp_path: Path
) -> None:
    from regen.store.holdout import read_prompts

    def held(run: Path, seed: int, name: str) -> list[str]:
        export_run(
            RunDir.open(run, create=False),
            str(tmp_path / name),
            ExportSettings.build(seed=seed, holdout=3),
        )
        return [p.sample_id for p in read_prompts(tmp_path / name / layout.HOLDOUT)]

    first = held(holdout_run, 7, "a")
    assert held(holdout_run, 7, "b") == first
    # the same rows split into other parts, in another order
    swapped = tmp_path / "swapped"
    shutil.copytree(holdout_run, swapped)
    parts = sorted((swapped / "parts").glob("*.parquet"))
    tables = [pq.read_table(p) for p in parts]
    parts[0].rename(swapped / "parts" / "s2-00009.parquet")
    pq.write_table(tables[1], swapped / "parts" / "s1-00001.parquet")
    assert held(swapped, 7, "c") == first
    others = {tuple(held(holdout_run, seed, f"s{seed}")) for seed in range(1, 6)}
    assert len(others) > 1  # the seed decides


def test_holdout_in_pretokenized_shards_and_removed_by_an_export_without(
    holdout_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    full = export_run(
        RunDir.open(holdout_run, create=False), str(out), ExportSettings.build(seed=7)
    )
    held = export_run(
        RunDir.open(holdout_run, create=False), str(out), ExportSettings.build(seed=7, holdout=2)
    )
    assert held.rows_written == full.rows_written - held.dropped["holdout"]
    assert len(_lines(out)) == held.rows_written
    assert (out / layout.HOLDOUT).is_file()
    again = export_run(
        RunDir.open(holdout_run, create=False), str(out), ExportSettings.build(seed=7)
    )  # no holdout: those samples train now
    assert not (out / layout.HOLDOUT).exists() and again.holdout_file is None
    assert "holdout" not in again.dropped
    with pytest.raises(ConfigError, match="holdout: Input should be greater than or equal to 0"):
        export_run(
            RunDir.open(holdout_run, create=False), str(out), ExportSettings.build(holdout=-1)
        )


def test_train_uses_the_shards_only_and_a_re_export_keeps_the_holdout(
    holdout_run: Path, tmp_path: Path
) -> None:
    from regen.store import RunDir
    from regen.train.config import ExportSpec, load_train_config
    from regen.train.data import (
        default_holdout,
        export_is_stale,
        export_options,
        export_shards,
        read_export_stats,
    )

    def holdout_of(rd: RunDir, out: Path) -> int:
        return default_holdout(ExportSettings.of_run(rd), read_export_stats(out))

    rd = RunDir.open(str(holdout_run))
    out = tmp_path / "export"
    assert holdout_of(rd, out) == 2  # no export yet: the manifest's export.holdout
    export_run(
        RunDir.open(holdout_run, create=False), str(out), ExportSettings.build(seed=7, holdout=3)
    )
    assert layout.HOLDOUT not in {p.name for p in export_shards(out)}
    assert export_shards(out) and all(p.name.startswith("shard-") for p in export_shards(out))
    assert not export_is_stale(rd, out)
    assert holdout_of(rd, out) == 3  # what the export being replaced held out
    # regen train's re-export: that holdout unless the train config says
    cfg = load_train_config(REPO / "manifests" / "demo-train.yaml")  # export.holdout unset
    assert export_options(rd, cfg, read_export_stats(out)).holdout == 3
    told = cfg.model_copy(update={"export": ExportSpec(holdout=0)})
    assert export_options(rd, told, read_export_stats(out)).holdout == 0
    (out / layout.EXPORT_STATS).write_text("{broken")
    assert holdout_of(rd, out) == 2
    bare = RunDir.open(str(tmp_path / "bare"), create=True)
    assert holdout_of(bare, tmp_path / "none") == 0


def test_cli_holdout_and_bench_finds_it(
    holdout_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`regen export` takes the manifest's export.holdout (or --holdout); `regen bench --run`
    sends exactly those prompts to both servers."""
    from regen.bench.report import read_report
    from regen.cli.main import main
    from regen.devkit.simulate.testing import simulator_in_thread
    from regen.store.holdout import holdout_path, read_prompts

    run = tmp_path / "run"
    shutil.copytree(holdout_run, run)
    assert main(["export", str(run), "--out", str(run / "export")]) == 0
    out = capsys.readouterr().out
    assert "3 samples held out (2 per source at most)" in out
    assert main(["export", str(run), "--out", str(tmp_path / "o"), "--holdout", "1"]) == 0
    assert len(read_prompts(tmp_path / "o" / layout.HOLDOUT)) == 2
    assert main(["export", str(run), "--out", str(tmp_path / "o"), "--holdout", "-1"]) == 2

    assert holdout_path(run) == run / "export" / layout.HOLDOUT
    prompts = read_prompts(holdout_path(run))
    opts = {"instant": True, "mean_tokens": 8, "length_sigma": 0}
    with (
        simulator_in_thread(**opts) as base,
        simulator_in_thread(**opts, speculative_algorithm="EAGLE3") as spec,
    ):
        args = ["bench", "--baseline", base.url, "--speculative", spec.url, "--run", str(run),
                "--concurrency", "1", "--max-tokens", "8"]  # fmt: skip
        assert main(args) == 0, capsys.readouterr().err
        keys = base.stats(keys=True)["keys"]
    rep = read_report(run / "bench" / "bench.json")
    assert rep.settings.prompts == len(prompts) == 3
    assert {s.source: s.prompts for s in rep.sources} == {"chat": 2, "tools": 1}
    assert {s.source: s.kind for s in rep.sources} == {"chat": "chat", "tools": "tool-calling"}
    assert len(keys) == 3  # three distinct requests (the warm-up repeats the first)


def _planned(root: Path, samples: list[Sample]) -> None:
    """Record ``samples`` as the latest plan (plan/, plan.json), as a session writes it."""
    from regen.manifest import parse_manifest
    from regen.plan.index import IndexBuilder
    from regen.sources import source_set

    rd = RunDir.open(root)
    m = parse_manifest({"name": "x", "target": {"model": "m", "tokenizer": str(TOKENIZER)},
                        "sources": [{"name": n, "adapter": "xlam", "hub": {"id": f"d/{n}"}}
                                    for n in sorted({s.source for s in samples})]})  # fmt: skip
    # hub sources: the planned samples themselves are kept in plan/
    b = IndexBuilder(rd, source_set(m))
    for s in samples:
        b.add(s, repeat=False)
    assert b.write(limit=None, complete=True)
    layout.PLAN_FILE.write(rd, layout.PlanRecord(sources={}))


def test_stale_answers_are_never_exported_and_a_setting_can_be_kept(tmp_path: Path) -> None:
    """Against the recorded plan: a sample it no longer holds (its row edited into a new id)
    and an answer to other content (a row edited in place, superseded by a new attempt once
    answered) are left out; --setting keeps one settings id and the native rows."""
    r = Renderer.from_dir(TOKENIZER)
    ask = [Message("user", "Weather in Lisbon?")]
    edited = [Message("user", "Weather in Porto?")]
    old = Sample(id="x:1", source="x", messages=ask)  # answered, then its row changed
    new = Sample(id="x:1", source="x", messages=edited)
    gone = Sample(id="x:h0ld", source="x", messages=[Message("user", "Gone since.")])
    kept = Sample(id="x:2", source="x", messages=[Message("user", "Still here.")])
    nat = _native_samples()[0]

    def row(s: Sample, setting: str, attempt: int = 0) -> dict:
        s.meta = {"regen.attempt": attempt}
        return build_turn_row(s, 0, s.messages, _res("Think.", "Answer."), r, settings=setting)

    root = tmp_path / "run"
    (root / "parts").mkdir(parents=True)
    first = [row(old, "aaaa0001"), row(gone, "aaaa0001"), row(kept, "aaaa0001"), native_row(nat)]
    pq.write_table(rows_to_table(first), root / "parts" / "s1-00000.parquet")
    layout.RUN_FILE.write(RunDir.open(root), layout.RunRecord(
        name="x", fingerprint="f", model="m", created_at=0, regen_version="0",
        settings={"aaaa0001": {"sampling.temperature": 0.6},
                  "bbbb0002": {"sampling.temperature": 0.7}}))  # fmt: skip
    _planned(root, [new, kept, nat])

    stats = export_run(
        RunDir.open(root),
        str(tmp_path / "a"),
        ExportSettings.build(shard_rows=0, drop_flags="none"),
    )
    assert stats.rows_written == 2  # x:2 and the native row: x:1 is stale, x:h0ld not planned
    assert stats.dropped == {"not_planned": 1, "stale": 1}
    # once the edited row is answered (a new attempt, under another setting after --force)
    pq.write_table(rows_to_table([row(new, "bbbb0002", attempt=1)]),
                   root / "parts" / "s2-00000.parquet")  # fmt: skip
    stats = export_run(
        RunDir.open(root),
        str(tmp_path / "b"),
        ExportSettings.build(shard_rows=0, drop_flags="none"),
    )
    assert stats.rows_written == 3 and stats.dropped == {"not_planned": 1, "superseded": 1}
    assert stats.settings == {"aaaa0001": 1, "bbbb0002": 1, "native": 1}
    one = export_run(
        RunDir.open(root),
        str(tmp_path / "c"),
        ExportSettings.build(shard_rows=0, drop_flags="none", setting="aaaa0001"),
    )
    assert one.settings == {"aaaa0001": 1, "native": 1}
    assert one.dropped == {"not_planned": 1, "superseded": 1, "other_setting": 1}
    with pytest.raises(ConfigError, match="aaaa0001, bbbb0002"):
        export_run(RunDir.open(root), str(tmp_path / "d"), ExportSettings.build(setting="cccc0003"))


def _unproven_run(root: Path, manifest: str = "name: x\n") -> None:
    """One row of each kind: local rows whose count matched, whose tool call was rebuilt,
    whose count differs or is unknown; a server row whose local render differs (its ids are
    the server's); a native row."""
    r = Renderer.from_dir(TOKENIZER)
    req = [Message("user", "Hi")]
    n = len(r.render_turn(req, None, reasoning="R.", content="A.").response_ids)

    def row(sid: str, completion: int | None, calls=()) -> dict:
        res = _res("R.", "" if calls else "A.", "tool_calls" if calls else "stop", calls)
        res.completion_tokens = completion
        sample = Sample(id=sid, source=sid.split(":")[0], messages=[], tools=TOOLS)
        return build_turn_row(sample, 0, req, res, r)

    call = ToolCall("functions.get_weather:0", "get_weather", '{"city": "Oslo"}')
    server = row("server:1", n)
    server.update(token_source="server", token_check="mismatch")
    rows = [row("local:1", n), row("tools:1", None, [call]), row("local:2", n + 5),
            row("local:3", None), server, native_row(_native_samples()[0])]  # fmt: skip
    (root / "parts").mkdir(parents=True)
    pq.write_table(table_of(rows), root / "parts" / "p.parquet")
    (root / "manifest.yaml").write_text(manifest)


def test_unproven_local_rows_are_dropped_by_default_and_stats_say_so(tmp_path: Path) -> None:
    """Issue 31, item 10: a row that cannot be shown to be the model's tokens is not trained
    on by default (a server-id row always is the model's tokens)."""
    _unproven_run(tmp_path / "run")
    stats = export_run(RunDir.open(tmp_path / "run", create=False), str(tmp_path / "out"))
    assert stats.token_check == {"count_match": 1, "tool_calls_rebuilt": 1, "count_mismatch": 1,
                                 "count_unknown": 1, "mismatch": 1}  # fmt: skip
    assert stats.dropped == {"unproven_tokens": 3}
    assert stats.rows_written == 3 and stats.token_source == {"local": 1, "server": 1, "native": 1}
    saved = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert saved["keep_unproven"] is False and saved["dropped"] == {"unproven_tokens": 3}
    assert saved["sources"]["tools"]["dropped"] == {"unproven_tokens": 1}
    assert saved["sources"]["local"]["dropped"] == {"unproven_tokens": 2}

    kept = export_run(
        RunDir.open(tmp_path / "run", create=False),
        str(tmp_path / "all"),
        ExportSettings.build(keep_unproven=True),
    )
    assert kept.dropped == {} and kept.rows_written == 6
    assert json.loads((tmp_path / "all" / "stats.json").read_text())["keep_unproven"] is True


def test_unproven_rows_kept_by_the_manifest_or_the_flag(tmp_path: Path, capsys) -> None:
    from regen.cli.main import main

    _unproven_run(tmp_path / "run")
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "o1")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "3 locally rendered row(s) dropped as unproven_tokens" in out
    assert "; token check: count_match 1," in out  # local rows' checks too, not "server" ones
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "o2"),
                 "--keep-unproven"]) == 0  # fmt: skip
    assert json.loads((tmp_path / "o2" / "stats.json").read_text())["rows_written"] == 6
    _unproven_run(tmp_path / "run2", "name: x\nexport:\n  keep_unproven: true\n")
    assert main(["export", str(tmp_path / "run2"), "--out", str(tmp_path / "o3")]) == 0
    saved = json.loads((tmp_path / "o3" / "stats.json").read_text())
    assert saved["rows_written"] == 6 and saved["keep_unproven"] is True
