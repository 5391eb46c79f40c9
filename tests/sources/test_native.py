"""Native-row validation against the demo rows, and the demo file's reproducibility."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regen.core.errors import TemplateError
from regen.core.sample import Sample
from regen.devkit.tokenizers.demo_native import write_demo_native
from regen.devkit.tokenizers.tiny import VOCAB_SIZE
from regen.sources.native import VocabInfo, validate_native
from regen.targets.kimi import KIMI

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"
DEMO = REPO / "manifests" / "demo" / "kimi_native.jsonl"


@pytest.fixture(scope="module")
def vocab() -> VocabInfo:
    return VocabInfo.from_dir(TOKENIZER, KIMI)


def _sample(row: dict) -> Sample:
    return Sample(
        id=f"native:{row['id']}",
        source="native",
        messages=[],
        mode="native",
        input_ids=row["input_ids"],
        loss_mask=row["loss_mask"],
    )


def test_vocab_info_from_tiny_tokenizer(vocab: VocabInfo) -> None:
    assert vocab.vocab_size == VOCAB_SIZE
    assert len(vocab.turn_token_ids) == 3
    assert all(VOCAB_SIZE - 15 <= i < VOCAB_SIZE for i in vocab.turn_token_ids)


def test_vocab_info_rejects_missing_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(TemplateError):
        VocabInfo.from_dir(tmp_path, KIMI)  # no tokenizer at all


def test_demo_rows_reasons(vocab: VocabInfo) -> None:
    rows = [json.loads(line) for line in DEMO.read_text().splitlines()]
    got = {r["id"]: validate_native(_sample(r), vocab) for r in rows}
    assert got == {
        "native-0001": None,
        "native-0002": None,
        "native-0003": None,
        "native-0004": None,
        "native-0005": "length_mismatch",
        "native-0006": "mask_value",
        "native-0007": "id_out_of_vocab",
        "native-0008": "no_turn_tokens",
        "native-0009": "mask_all_zero",
    }
    # the last line is an exact duplicate of the first
    lines = DEMO.read_text().splitlines()
    assert len(lines) == 10 and lines[-1] == lines[0]


@pytest.mark.parametrize(
    ("ids", "mask", "reason"),
    [
        ([], [], "empty"),
        ([1, 2], [0, True], "mask_value"),
        ([1, 2], [0, 1.0], "mask_value"),
        ([1, -1], [0, 1], "id_out_of_vocab"),
        ([1, 2.0], [0, 1], "id_type"),
        ([1, VOCAB_SIZE], [0, 1], "id_out_of_vocab"),
    ],
)
def test_edge_reasons(vocab: VocabInfo, ids: list, mask: list, reason: str) -> None:
    assert validate_native(_sample({"id": "x", "input_ids": ids, "loss_mask": mask}), vocab) == (
        reason
    )


def test_valid_row_with_top_id_is_accepted(vocab: VocabInfo) -> None:
    row = json.loads(DEMO.read_text().splitlines()[0])
    row["input_ids"][0] = VOCAB_SIZE - 1  # [PAD], the last valid id
    assert validate_native(_sample(row), vocab) is None


def test_demo_file_is_reproducible(tmp_path: Path) -> None:
    out = tmp_path / "native.jsonl"
    write_demo_native(out, TOKENIZER)
    assert out.read_bytes() == DEMO.read_bytes()
