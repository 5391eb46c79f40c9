"""The draft-vocabulary mapping: SpecForge's rule, its file format and its loader."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from regen.core.errors import TrapError
from regen.store import RunDir
from regen.store import layout as L
from regen.train.vocab import (
    check_vocab_mapping,
    choose_draft_ids,
    count_loss_tokens,
    write_vocab_mapping,
)

torch = pytest.importorskip("torch")


def _prompts(tmp_path: Path, rows: list[tuple[list[int], list[int]]]) -> Path:
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(json.dumps({"input_ids": a, "loss_mask": m}) + "\n" for a, m in rows))
    return p


ROWS = [
    ([1, 5, 5, 7, 9, 9, 9], [0, 1, 1, 1, 1, 1, 1]),
    ([2, 9, 7, 3, 3], [0, 0, 1, 1, 1]),  # 2 and 9 of the prompt are not counted here
]


def test_counts_only_loss_masked_tokens(tmp_path: Path) -> None:
    found = count_loss_tokens([_prompts(tmp_path, ROWS)])
    assert found.counts == Counter({9: 3, 5: 2, 7: 2, 3: 2})
    assert (found.rows, found.loss_tokens) == (2, 9)


def test_most_frequent_ids_ties_by_id_then_the_smallest_unused_fill() -> None:
    counts = Counter({9: 3, 5: 2, 7: 2, 3: 2})
    assert choose_draft_ids(counts, 3, 16) == [3, 5, 9]  # 3 and 5 win the tie against 7
    assert choose_draft_ids(counts, 6, 16) == [0, 1, 3, 5, 7, 9]
    with pytest.raises(TrapError) as ei:
        choose_draft_ids(Counter({20: 1}), 3, 16)
    assert ei.value.trap == "vocab-size"


def test_the_choice_is_specforges_own_where_no_tie_decides() -> None:
    from specforge.data.preprocessing import process_token_dict_to_mappings

    counts = Counter({i: 1000 - 7 * i for i in range(0, 120, 3)})  # distinct frequencies
    d2t, t2d = process_token_dict_to_mappings(Counter(counts), 16, 128)
    ours = choose_draft_ids(counts, 16, 128)
    assert ours == (torch.arange(16) + d2t).tolist()
    assert ours == torch.nonzero(t2d).flatten().tolist()


def test_file_loads_into_specforges_draft_and_maps_draft_to_target_ids(tmp_path: Path) -> None:
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from transformers import LlamaConfig

    rd = RunDir.open(str(tmp_path / "run"), create=True)
    record = write_vocab_mapping(rd, _prompts(tmp_path, ROWS), draft_vocab_size=4, vocab_size=16)
    assert (record.rows, record.loss_tokens, record.distinct_ids) == (2, 9, 4)
    assert record.coverage == 1.0 and record.path == rd.path(L.VOCAB_MAPPING)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=2,
        head_dim=32, vocab_size=16, draft_vocab_size=4, num_hidden_layers=1,
        max_position_embeddings=64, pad_token_id=0,
    )  # fmt: skip
    draft = LlamaForCausalLMEagle3(config)
    draft.load_vocab_mapping(record.path)  # SpecForge's own loader of model.vocab_mapping_path
    assert draft.vocab_mapping_loaded
    assert (torch.arange(4) + draft.d2t).tolist() == [3, 5, 7, 9]
    assert torch.nonzero(draft.t2d).flatten().tolist() == [3, 5, 7, 9]
    assert check_vocab_mapping(rd, rows=2, loss_tokens=9) == record


def test_cluster_check_refuses_a_changed_mapping_or_other_data(tmp_path: Path) -> None:
    rd = RunDir.open(str(tmp_path / "run"), create=True)
    write_vocab_mapping(rd, _prompts(tmp_path, ROWS), draft_vocab_size=4, vocab_size=16)
    with pytest.raises(TrapError, match="built from 2 rows / 9 loss tokens"):
        check_vocab_mapping(rd, rows=3, loss_tokens=12)
    Path(rd.path(L.VOCAB_MAPPING)).write_bytes(b"other")
    with pytest.raises(TrapError, match="changed after it was written") as ei:
        check_vocab_mapping(rd, rows=2, loss_tokens=9)
    assert ei.value.trap == "vocab-mapping"
    Path(rd.path(L.VOCAB_MAPPING)).unlink()
    with pytest.raises(TrapError, match="is missing"):
        check_vocab_mapping(rd, rows=2, loss_tokens=9)
