"""One test per trap: each refuses with a TrapError that names the trap and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_fixtures import good_rows, kimi_config, kimi_row

from regen.core.errors import TrapError
from regen.targets.kimi import KIMI
from regen.train import traps
from regen.train.checks import check_against_target, check_train_config
from regen.train.config import parse_train_config

#: Kimi's published ids of the tokens that open a turn
KIMI_TURN_OPEN_IDS = frozenset(KIMI.published_ids[t] for t in KIMI.turn_open_tokens)


def refuse(trap: str, fn, *args, **kw) -> TrapError:
    with pytest.raises(TrapError) as ei:
        fn(*args, **kw)
    assert ei.value.trap == trap
    assert f"[{trap}]" in str(ei.value)
    assert "Fix:" in str(ei.value)
    return ei.value


@pytest.mark.parametrize("algo", ["EAGLE", "eagle3", "EAGLE-3", "NEXTN", ""])
def test_eagle_instead_of_eagle3_in_serving(algo: str) -> None:
    cfg = parse_train_config(kimi_config(serving={"speculative_algorithm": algo}))
    e = refuse(traps.TRAP_ALGORITHM, check_train_config, cfg)
    assert "serving.speculative_algorithm" in str(e)
    assert "EAGLE3" in e.fix


def test_eagle_instead_of_eagle3_in_capture() -> None:
    cfg = parse_train_config(kimi_config(capture={"speculative_algorithm": "EAGLE"}))
    e = refuse(traps.TRAP_ALGORITHM, check_train_config, cfg)
    assert "capture.speculative_algorithm" in str(e)


def test_sglang_ids_declared_as_specforge_numbering() -> None:
    cfg = parse_train_config(kimi_config(draft={"aux_layer_ids": [2, 30, 58]}))
    e = refuse(traps.TRAP_LAYER_NUMBERING, check_train_config, cfg)
    assert "[1, 29, 57]" in e.fix


def test_specforge_ids_declared_as_sglang_numbering() -> None:
    cfg = parse_train_config(
        kimi_config(draft={"aux_layer_ids": [1, 29, 57], "layer_numbering": "sglang"})
    )
    e = refuse(traps.TRAP_LAYER_NUMBERING, check_train_config, cfg)
    assert "[2, 30, 58]" in e.fix


@pytest.mark.parametrize(
    ("ids", "numbering"),
    [([1, 29, 61], "specforge"), ([0, 30, 58], "sglang"), ([2, 30, 62], "sglang")],
)
def test_ids_out_of_range_for_their_numbering(ids: list[int], numbering: str) -> None:
    refuse(traps.TRAP_LAYER_NUMBERING, traps.check_aux_layer_ids, ids, numbering, 61)


def test_numbering_is_converted_to_specforge() -> None:
    assert traps.check_aux_layer_ids([2, 30, 58], "sglang", 61) == [1, 29, 57]
    assert traps.check_aux_layer_ids([1, 29, 57], "specforge", 61) == [1, 29, 57]
    # a non-canonical but valid choice passes in either numbering
    assert traps.check_aux_layer_ids([3, 20, 40], "specforge", 61) == [3, 20, 40]
    assert traps.canonical_aux_ids(61) == [1, 29, 57]
    assert traps.canonical_aux_ids(32) == [1, 15, 28]


@pytest.mark.parametrize(
    ("ids", "numbering", "trap"),
    [
        ([1, 29, 57], "specforge", None),  # SGLang shifts it to [2, 30, 58]: what was trained
        ([2, 30, 58], "sglang", None),  # the same list, written in SGLang numbering
        ([2, 29, 57], "specforge", traps.TRAP_AUX_SHIFT),  # used as is: one layer early
        ([3, 31, 59], "sglang", traps.TRAP_AUX_SHIFT),  # = SpecForge [2, 30, 58]
        ([2, 30, 58], "specforge", traps.TRAP_LAYER_NUMBERING),  # refused as before
    ],
)
def test_aux_ids_sglang_would_capture_one_layer_early(
    ids: list[int], numbering: str, trap: str | None
) -> None:
    cfg = parse_train_config(
        kimi_config(draft={"aux_layer_ids": ids, "layer_numbering": numbering})
    )
    if trap is None:
        assert check_train_config(cfg) == [1, 29, 57]
        return
    e = refuse(trap, check_train_config, cfg)
    if trap == traps.TRAP_AUX_SHIFT:
        assert "first id is 1" in str(e) and "[1, 29, 57]" in e.fix


def test_fc_input_width_mismatch() -> None:
    cfg = parse_train_config(kimi_config(draft={"fc_input_size": 7168}))
    e = refuse(traps.TRAP_FC_WIDTH, check_train_config, cfg)
    assert "21504" in e.fix


def test_fc_input_width_needs_three_aux_layers() -> None:
    cfg = parse_train_config(kimi_config(draft={"aux_layer_ids": [1, 57]}))
    refuse(traps.TRAP_FC_WIDTH, check_train_config, cfg)


def test_draft_hidden_differs_from_target() -> None:
    cfg = parse_train_config(kimi_config(draft={"hidden_size": 4096}))
    e = refuse(traps.TRAP_DRAFT_HIDDEN, check_train_config, cfg)
    assert "7168" in e.fix


def test_vocab_mismatch_draft_vs_target() -> None:
    cfg = parse_train_config(kimi_config(draft={"vocab_size": 160000}))
    refuse(traps.TRAP_VOCAB, check_train_config, cfg)


def test_vocab_smaller_than_tokenizer() -> None:
    cfg = parse_train_config(kimi_config(target={"tokenizer_size": 200000}))
    refuse(traps.TRAP_VOCAB, check_train_config, cfg)


def test_vocab_data_holds_ids_past_the_vocab() -> None:
    refuse(
        traps.TRAP_VOCAB,
        traps.check_vocab,
        target_vocab=32000,
        draft_vocab=32000,
        draft_vocab_size=32000,
        max_token_id=163588,
    )


def test_target_numbers_differ_from_its_config_json() -> None:
    cfg = parse_train_config(kimi_config())
    e = refuse(
        traps.TRAP_TARGET_SHAPE,
        check_against_target,
        cfg,
        {"num_hidden_layers": 60, "hidden_size": 7168, "vocab_size": 163840},
    )
    assert "target.num_layers" in str(e)
    check_against_target(cfg, {"num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 163840})


def _jsonl(tmp_path: Path, rows: list[dict]) -> Path:
    p = tmp_path / "rows.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_empty_loss_masks(tmp_path: Path) -> None:
    empty = kimi_row([7], [8])
    empty["loss_mask"] = [0] * len(empty["input_ids"])
    scan = traps.scan_prompts([_jsonl(tmp_path, [*good_rows(3), empty])])
    assert (scan.rows, scan.empty_mask_rows) == (4, 1)
    e = refuse(traps.TRAP_EMPTY_LOSS_MASK, traps.check_loss_masks, scan)
    assert "1 of 4" in str(e) and "rows.jsonl:4" in str(e)


def test_loss_mask_covers_the_prompt(tmp_path: Path) -> None:
    full = kimi_row([7], [8])
    full["loss_mask"] = [1] * len(full["input_ids"])
    scan = traps.scan_prompts([_jsonl(tmp_path, [full, *good_rows(2)])])
    assert scan.covers_prompt_rows == 1
    refuse(traps.TRAP_MASK_COVERS_PROMPT, traps.check_loss_masks, scan)


def test_good_rows_pass(tmp_path: Path) -> None:
    scan = traps.scan_prompts([_jsonl(tmp_path, good_rows(5))])
    traps.check_loss_masks(scan)
    assert scan.rows == 5 and scan.loss_tokens == 5 * 6 and scan.max_token_id == IM_ASSISTANT_MAX


IM_ASSISTANT_MAX = 163607  # </think> is the largest id in good_rows


def test_tokenizer_larger_than_the_vocab_is_refused_where_the_target_is_readable(
    tmp_path: Path,
) -> None:
    import shutil

    from train_fixtures import REPO

    from regen.train.checks import check_target_files

    target = tmp_path / "target"
    shutil.copytree(REPO / "manifests" / "demo" / "tokenizer", target)  # 1024 tokens
    (target / "config.json").write_text(
        json.dumps(
            {"text_config": {"num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 512}}
        )
    )
    cfg = parse_train_config(
        kimi_config(
            target={"path": str(target), "vocab_size": 512},
            draft={"vocab_size": 512, "draft_vocab_size": 256},
        )
    )
    e = refuse(traps.TRAP_VOCAB, check_target_files, cfg)
    assert "1024 tokens" in str(e)


def test_trained_turn_opening_token_anywhere_covers_the_prompt(tmp_path: Path) -> None:
    """Two turns in one row with the second turn's framing trained: mask[0] is 0, not all 1."""
    from train_fixtures import IM_ASSISTANT, IM_USER

    row = kimi_row([7], [8])
    start = row["input_ids"].index(IM_ASSISTANT)
    row["input_ids"] += [IM_USER, 9, IM_ASSISTANT, 10]
    row["loss_mask"] = row["loss_mask"][:start] + [0] * (len(row["loss_mask"]) - start) + [1] * 4
    path = _jsonl(tmp_path, [row, *good_rows(2)])
    assert traps.scan_prompts([path]).covers_prompt_rows == 0  # no vocab: cannot be seen
    scan = traps.scan_prompts([path], KIMI_TURN_OPEN_IDS)
    assert scan.covers_prompt_rows == 1 and scan.first_covers_prompt == f"{path}:1"
    refuse(traps.TRAP_MASK_COVERS_PROMPT, traps.check_loss_masks, scan)
    good = traps.scan_prompts([_jsonl(tmp_path, good_rows(3))], KIMI_TURN_OPEN_IDS)
    traps.check_loss_masks(good)


@pytest.mark.parametrize(
    "line",
    [
        "{not json",
        '{"input_ids": [1, 2]}',
        "[1, 2]",
        '{"input_ids": [1, 2], "loss_mask": [0]}',
        '{"input_ids": [1, "x"], "loss_mask": [0, 1]}',
        '{"input_ids": [1, 2], "loss_mask": [0, 2]}',
        '{"input_ids": 5, "loss_mask": [0]}',
    ],
)
def test_malformed_training_rows_are_a_trap_error(tmp_path: Path, line: str) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(good_rows(1)[0]) + "\n" + line + "\n")
    e = refuse(traps.TRAP_MALFORMED_DATA, traps.scan_prompts, [p])
    assert f"{p}:2" in str(e)


def test_turn_open_ids_from_tokenizer_kimi_vocab_or_none(tmp_path: Path) -> None:
    import shutil

    from train_fixtures import REPO

    from regen.train.checks import turn_open_ids

    target = tmp_path / "target"
    shutil.copytree(REPO / "manifests" / "demo" / "tokenizer", target)
    tiny = parse_train_config(kimi_config(target={"path": str(target)}))
    assert turn_open_ids(tiny) == {1012, 1013, 1014}  # the tiny tokenizer's own ids
    kimi = parse_train_config(kimi_config(target={"path": str(tmp_path / "absent")}))
    assert turn_open_ids(kimi) == KIMI_TURN_OPEN_IDS
    other = parse_train_config(
        kimi_config(
            target={"path": str(tmp_path / "absent"), "vocab_size": 32000},
            draft={"vocab_size": 32000, "draft_vocab_size": 32000},
        )
    )
    assert turn_open_ids(other) is None


def test_preflight_records_unexpected_failures(tmp_path: Path, monkeypatch) -> None:
    from regen.store import layout
    from regen.train import preflight

    def boom(run_dir: str) -> dict:
        raise KeyError("exec_argv")

    monkeypatch.setattr(preflight, "preflight", boom)
    assert preflight.main(["--run-dir", str(tmp_path)]) == 2
    rec = json.loads((tmp_path / layout.PREFLIGHT).read_text())
    assert rec["ok"] is False and rec["trap"] is None
    assert rec["error"].startswith("unexpected KeyError")


def test_preflight_records_malformed_data_as_a_trap(tmp_path: Path, monkeypatch) -> None:
    from regen.store import layout
    from regen.train import preflight

    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    monkeypatch.setattr(preflight, "preflight", lambda run_dir: traps.scan_prompts([bad]))
    assert preflight.main(["--run-dir", str(tmp_path)]) == 2
    rec = json.loads((tmp_path / layout.PREFLIGHT).read_text())
    assert rec["ok"] is False and rec["trap"] == traps.TRAP_MALFORMED_DATA
