"""The demo target's per-family training and response templates, without a server.

Fast: no model is trained beyond a few steps; the response templates are run through
transformers' own ``parse_response`` (what ``transformers serve`` streams through).
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from regen.core.errors import ConfigError
from regen.devkit.demo_target import (
    DEEPSEEK_V3_RESPONSE,
    QWEN3_RESPONSE,
    DemoTargetSpec,
    TrainingTurn,
    _epoch,
    build_demo_target,
    family_spec,
    key_fields,
)
from regen.manifest import load_manifest

REPO = Path(__file__).resolve().parents[3]
#: DemoTargetSpec's fields at BUILD_VERSION 4 (a Kimi build's key hashes exactly these)
V4_FIELDS = {"hidden", "layers", "heads", "head_dim", "intermediate", "seed", "steps", "batch",
             "lr", "tool_repeats", "threads", "shard_size"}  # fmt: skip
QWEN3_PREFIX = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def _parse(text: str, template: dict, prefix: str = QWEN3_PREFIX) -> dict:
    from transformers.utils.chat_parsing.response_parser import parse_response

    return parse_response(text, template, prefix=prefix)


def test_a_kimi_build_hashes_the_fields_of_before() -> None:
    spec = family_spec("kimi")
    assert spec == DemoTargetSpec()
    assert set(key_fields(spec)) == V4_FIELDS
    assert key_fields(spec) == {k: v for k, v in asdict(spec).items() if k in V4_FIELDS}
    tuned = key_fields(replace(spec, warmup=20, distinct_batches=True))
    assert tuned["warmup"] == 20 and tuned["distinct_batches"] is True


def test_the_new_families_train_on_distinct_batches_with_a_warmup() -> None:
    for name in ("qwen3", "deepseek_v3"):
        spec = family_spec(name)
        assert spec.distinct_batches and spec.warmup > 0
        assert (spec.hidden, spec.layers, spec.steps) == (64, 8, 400)  # the same model and steps
    assert family_spec("unknown") == DemoTargetSpec()


def _turns(n_plain: int, n_tools: int) -> list[TrainingTurn]:
    return [TrainingTurn(f"s{i}", [1] * (10 + i), [2, 3], i >= n_plain)
            for i in range(n_plain + n_tools)]  # fmt: skip


def test_distinct_batches_repeat_the_tool_batches_not_the_turns() -> None:
    turns = _turns(20, 12)
    seqs = [(t.prompt_ids + t.answer_ids, len(t.prompt_ids)) for t in turns]
    spec = DemoTargetSpec(batch=8, tool_repeats=4, distinct_batches=True)
    batches = _epoch(turns, seqs, spec, torch.Generator().manual_seed(0))
    assert all(len(set(b)) == len(b) for b in batches)  # no copies inside a batch
    assert all(len({turns[i].calls_tools for i in b}) == 1 for b in batches)
    seen = [i for b in batches for i in b]
    assert all(seen.count(i) == (4 if turns[i].calls_tools else 1) for i in range(len(turns)))
    assert len(batches) == 3 + 2 * 4  # 20 plain turns in 3 batches, 12 tool turns in 2, x4


def test_the_default_epoch_repeats_every_tool_turn() -> None:
    turns = [t for t in _turns(20, 12) for _ in range(12 if t.calls_tools else 1)]
    seqs = [(t.prompt_ids + t.answer_ids, len(t.prompt_ids)) for t in turns]
    batches = _epoch(turns, seqs, DemoTargetSpec(), torch.Generator().manual_seed(0))
    assert sorted(i for b in batches for i in b) == list(range(len(turns)))
    assert all(len(b) <= 8 for b in batches)


def test_a_qwen3_build_is_deterministic(tmp_path: Path) -> None:
    manifest = REPO / "manifests" / "demo-qwen3.yaml"
    spec = replace(family_spec("qwen3"), steps=3, warmup=2)  # the same code path, a few steps
    a = build_demo_target(tmp_path / "a", manifest, spec)
    b = build_demo_target(tmp_path / "b", manifest, spec)
    shards = sorted(p.name for p in a.glob("*.safetensors"))
    assert shards and all((a / n).read_bytes() == (b / n).read_bytes() for n in shards)
    config = json.loads((a / "tokenizer_config.json").read_text())
    assert config["response_template"] == QWEN3_RESPONSE
    marker = json.loads((a / "regen_demo_target.json").read_text())
    assert marker["family"] == "qwen3" and marker["spec"]["distinct_batches"] is True


def test_qwen3_calls_parse_with_their_arguments_as_written() -> None:
    text = ('<think>\nThe user needs a tool for this.\n</think>\n\n<tool_call>\n{"name": '
            '"convert_currency", "arguments": {"amount": 250, "to": "EUR"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "convert_currency", "arguments": {"amount": 250, "to": '
            '"JPY"}}\n</tool_call><|im_end|>')  # fmt: skip
    msg = _parse(text, QWEN3_RESPONSE)
    assert msg["thinking"] == "The user needs a tool for this."
    assert [c["function"] for c in msg["tool_calls"]] == [
        {"name": "convert_currency", "arguments": '{"amount": 250, "to": "EUR"}'},
        {"name": "convert_currency", "arguments": '{"amount": 250, "to": "JPY"}'},
    ]
    assert not msg.get("content")


@pytest.mark.parametrize(
    ("call", "expect"),
    [  # malformed arguments: a call with the raw text (the row's bad_tool_call flag)
        ('{"name": "get_weather", "arguments": {"city": "Lis}}', ("call", '{"city": "Lis}')),
        # no call head: left in the content, as vLLM's hermes parser leaves it
        ('{"name": "get__pents": "arguments": "cbon"}}', ("content", "<tool_call>")),
    ],
)
def test_a_garbled_qwen3_call_is_data_not_a_server_error(call: str, expect: tuple) -> None:
    text = f"<think>\nr\n</think>\n\n<tool_call>\n{call}\n</tool_call><|im_end|>"
    msg = _parse(text, QWEN3_RESPONSE)  # transformers' own json content raised here
    kind, value = expect
    if kind == "call":
        assert [c["function"]["arguments"] for c in msg["tool_calls"]] == [value]
    else:
        assert value in msg["content"] and not msg.get("tool_calls")


def test_qwen3_and_deepseek_plain_answers_split_reasoning() -> None:
    plain = _parse("<think>\nLet me think.\n</think>\n\nHere.<|im_end|>", QWEN3_RESPONSE)
    assert (plain["thinking"], plain["content"]) == ("Let me think.", "Here.")
    ds = _parse("Let me think.</think>Here.<｜end▁of▁sentence｜>", DEEPSEEK_V3_RESPONSE,
                prefix="<｜User｜>hi<｜Assistant｜><think>")  # fmt: skip
    assert (ds["thinking"], ds["content"]) == ("Let me think.", "Here.")


def test_a_deepseek_answer_to_a_tool_output_starts_after_it() -> None:
    prefix = ("<｜User｜>Price?<｜Assistant｜></think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
              'price<｜tool▁sep｜>{"s": "M"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
              "<｜end▁of▁sentence｜><｜tool▁output▁begin｜>412<｜tool▁output▁end｜>")  # fmt: skip
    msg = _parse("<think>r</think>Here.<｜end▁of▁sentence｜>", DEEPSEEK_V3_RESPONSE, prefix)
    assert (msg["thinking"], msg["content"]) == ("r", "Here.")
    assert not msg.get("tool_calls")  # the history's call is not the answer's


#: the fix of DeepSeek-V3.1's template that manifests/demo-deepseek/served-template.jinja holds:
#: a history call's arguments as an object are written back with tojson (a string as before)
_ARGS = "tool['function']['arguments']"
SERVED_FIX = (f"+ {_ARGS} +", f"+ ({_ARGS} if {_ARGS} is string else {_ARGS} | tojson) +")


def test_the_served_deepseek_template_renders_dict_arguments_as_the_real_one_strings() -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(REPO / "manifests" / "demo-deepseek" / "tokenizer")
    served = load_manifest(REPO / "manifests" / "demo-deepseek.yaml").served_template()
    assert served == tok.chat_template.replace(*SERVED_FIX)  # the real one, that fix only
    assert tok.chat_template.count(SERVED_FIX[0]) == 3
    call = {"id": "c0", "type": "function",
            "function": {"name": "price", "arguments": '{"symbol": "MSFT", "n": 2}'}}  # fmt: skip
    msgs = [{"role": "user", "content": "Price?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "412", "tool_call_id": "c0"}]  # fmt: skip
    as_dict = json.loads(json.dumps(msgs))
    as_dict[1]["tool_calls"][0]["function"]["arguments"] = {"symbol": "MSFT", "n": 2}
    real = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    with pytest.raises(TypeError):  # what vLLM and transformers serve hand the real template
        tok.apply_chat_template(as_dict, tokenize=False, add_generation_prompt=True)
    for m in (msgs, as_dict):
        out = tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True,
                                      chat_template=served)  # fmt: skip
        assert out == real


def test_a_missing_served_template_is_one_config_error(tmp_path: Path) -> None:
    text = (REPO / "manifests" / "demo-deepseek.yaml").read_text(encoding="utf-8")
    (tmp_path / "m.yaml").write_text(text.replace("demo-deepseek/served-template.jinja",
                                                  str(tmp_path / "nope.jinja")))  # fmt: skip
    with pytest.raises(ConfigError, match=r"target\.chat_template: cannot read .*nope\.jinja"):
        load_manifest(tmp_path / "m.yaml").served_template()
