"""Renderer: response reassembly per think state, split tokenization, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.core.errors import TemplateError
from regen.core.sample import Message, ToolCall
from regen.targets.kimi import KIMI
from regen.template.render import Renderer

# the Kimi family's response assembly (regen.targets.kimi)
response_text = KIMI.response_text
split_response = KIMI.split_response
think_state = KIMI.think_state
tool_calls_section = KIMI.tool_calls_text

TOKENIZER = Path(__file__).resolve().parents[2] / "manifests" / "demo" / "tokenizer"
CALL = ToolCall(id="functions.get_weather:0", name="get_weather", arguments='{"city": "Oslo"}')
SECTION = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    '<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|><|tool_calls_section_end|>'
)


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    return Renderer.from_dir(TOKENIZER)


def test_think_state_reads_the_prompt_tail() -> None:
    assert think_state("...<|im_middle|><think>") == "open"
    assert think_state("...<|im_middle|><think></think>") == "closed"
    assert think_state("...<|im_middle|>") == "none"
    assert think_state("...<|im_middle|><think>\n") == "open"


def test_tool_calls_section_default_id_and_verbatim_arguments() -> None:
    assert tool_calls_section([CALL]) == SECTION
    no_id = ToolCall(id="", name="f", arguments="not json, kept verbatim")
    assert tool_calls_section([CALL, no_id]).endswith(
        "<|tool_call_begin|>functions.f:1<|tool_call_argument_begin|>not json, kept verbatim"
        "<|tool_call_end|><|tool_calls_section_end|>"
    )
    assert tool_calls_section([]) == ""


@pytest.mark.parametrize(
    ("state", "reasoning", "content", "calls", "finish", "expected"),
    [
        ("open", "R", "C", (), "stop", "R</think>C<|im_end|>"),
        ("open", None, "C", (), "stop", "</think>C<|im_end|>"),
        ("open", "R", "", (CALL,), "tool_calls", "R</think>" + SECTION + "<|im_end|>"),
        ("open", "R", "", (), "length", "R"),  # cut inside the reasoning
        ("open", "R", "Par", (), "length", "R</think>Par"),  # cut inside the content
        ("closed", None, "C", (), "stop", "C<|im_end|>"),
        ("closed", "", "C", (CALL,), "stop", "C" + SECTION + "<|im_end|>"),
        ("none", "R", "C", (), "stop", "<think>R</think>C<|im_end|>"),
        ("none", None, "C", (), "stop", "C<|im_end|>"),
        ("none", "R", "", (), "length", "<think>R"),
    ],
)
def test_response_text(
    state: str, reasoning: str | None, content: str, calls: tuple, finish: str, expected: str
) -> None:
    assert response_text(state, reasoning, content, calls, finish) == expected  # type: ignore[arg-type]


def test_closed_prompt_with_reasoning_is_an_error() -> None:
    with pytest.raises(TemplateError, match="thinking off"):
        response_text("closed", "some reasoning", "C")


def test_render_turn_splits_prompt_and_response(renderer: Renderer) -> None:
    msgs = [Message("user", "Hello there")]
    turn = renderer.render_turn(msgs, None, reasoning="Be kind.", content="Hi!")
    assert turn.think_state == "open"
    assert turn.response_text == "Be kind.</think>Hi!<|im_end|>"
    assert turn.prompt_ids == renderer.encode(turn.prompt_text)
    assert turn.response_ids == renderer.encode(turn.response_text)
    assert turn.input_ids == turn.prompt_ids + turn.response_ids
    assert turn.loss_mask == [0] * len(turn.prompt_ids) + [1] * len(turn.response_ids)
    assert renderer.decode(turn.input_ids) == turn.text
    # the boundary falls on a special token, so joint tokenization agrees
    assert renderer.encode(turn.text) == turn.input_ids


def test_thinking_off_renderer(tmp_path: Path) -> None:
    r = Renderer.from_dir(TOKENIZER, template_kwargs={"thinking": False})
    turn = r.render_turn([Message("user", "Hi")], None, reasoning=None, content="Hey.")
    assert turn.prompt_text.endswith("<|im_middle|><think></think>")
    assert turn.response_text == "Hey.<|im_end|>"
    with pytest.raises(TemplateError):
        r.render_turn([Message("user", "Hi")], None, reasoning="oops", content="Hey.")


def test_k2_thinking_style_prompt_without_think(renderer: Renderer) -> None:
    """A template whose generation prompt stops at <|im_middle|>: the model writes <think>."""
    original = renderer.tokenizer.chat_template
    gen = "{%- if thinking is defined and not thinking -%}<think></think>{%- else -%}<think>"
    assert original.count(gen) == 1
    renderer.tokenizer.chat_template = original.replace(gen, "{%- if false -%}{%- else -%}")
    try:
        turn = renderer.render_turn([Message("user", "Hi")], None, reasoning="R", content="C")
    finally:
        renderer.tokenizer.chat_template = original
    assert turn.think_state == "none"
    assert turn.prompt_text.endswith("<|im_assistant|>assistant<|im_middle|>")
    assert turn.response_text == "<think>R</think>C<|im_end|>"


def test_template_errors_become_template_error(renderer: Renderer) -> None:
    with pytest.raises(TemplateError, match="chat template failed"):
        renderer.render_prompt([{"role": "assistant", "tool_calls": [{"function": 3}]}])


def test_ids_and_hash(renderer: Renderer) -> None:
    assert renderer.end_id == renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert renderer.end_id in renderer.end_ids
    other = Renderer.from_dir(TOKENIZER, template_kwargs={"thinking": False})
    assert other.template_hash != renderer.template_hash


def test_missing_tokenizer_dir_is_a_template_error(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="cannot load tokenizer"):
        Renderer.from_dir(tmp_path / "nope")


def test_a_runs_render_settings_use_target_tokenizer_and_template_kwargs() -> None:
    from regen.engine.inputs import render_settings
    from regen.manifest import parse_manifest

    m = parse_manifest(
        {
            "name": "t",
            "target": {"model": "tiny", "tokenizer": "tokenizer"},
            "sampling": {"thinking": False},
            "sources": [
                {"name": "n", "adapter": "kimi_native", "mode": "native", "path": "x.jsonl"}
            ],
        },
        base_dir=TOKENIZER.parent,
    )
    r = Renderer.of(render_settings(m))
    assert r.template_kwargs == {"thinking": False}
    assert r.render_prompt([Message("user", "Hi")]).endswith("<think></think>")


def test_cut_right_after_think_close_is_read_from_the_completion_count(
    renderer: Renderer,
) -> None:
    msgs = [Message("user", "Think.")]
    plain = renderer.render_turn(msgs, None, reasoning="R r", content="", finish_reason="length")
    assert plain.response_text == "R r"
    n = len(plain.response_ids)
    closed = renderer.render_turn(
        msgs, None, reasoning="R r", content="", finish_reason="length", completion_tokens=n + 1
    )
    assert closed.response_text == "R r</think>"
    same = renderer.render_turn(
        msgs, None, reasoning="R r", content="", finish_reason="length", completion_tokens=n
    )
    assert same.response_text == "R r"


def test_parserless_output_is_split_at_the_models_own_think_close(renderer: Renderer) -> None:
    """transformers serve: reasoning=None, content holds reasoning + </think> + answer."""
    turn = renderer.render_turn(
        [Message("user", "Hi")], None, reasoning=None, content="Let me see.</think>Hello!"
    )
    assert turn.think_state == "open"
    assert turn.response_text == "Let me see.</think>Hello!<|im_end|>"
    assert turn.response_text.count("</think>") == 1
    assert (turn.reasoning, turn.content, turn.flag) == ("Let me see.", "Hello!", None)


def test_parserless_output_without_think_close_is_flagged(renderer: Renderer) -> None:
    turn = renderer.render_turn([Message("user", "Hi")], None, reasoning=None, content="Hello!")
    assert turn.response_text == "</think>Hello!<|im_end|>"  # inserted, as before ...
    assert turn.flag == "think_inserted"  # ... but never silently


@pytest.mark.parametrize(
    ("state", "reasoning", "content", "expected"),
    [
        ("open", None, "R</think>C", ("R", "C", None)),
        ("open", None, "R</think>C</think>D", ("R", "C</think>D", None)),
        ("open", None, "C", (None, "C", "think_inserted")),
        ("open", "R", "C", ("R", "C", None)),
        ("open", "R", "C<think>x", ("R", "C<think>x", "content_has_think")),
        ("open", None, "R</think><think>C", ("R", "<think>C", "content_has_think")),
        ("closed", None, "<think>C", (None, "<think>C", "content_has_think")),
        ("none", None, "<think>R</think>C", (None, "<think>R</think>C", None)),  # raw output
        ("none", "R", "<think>C", ("R", "<think>C", "content_has_think")),
    ],
)
def test_split_response(state: str, reasoning: str | None, content: str, expected: tuple) -> None:
    assert split_response(state, reasoning, content) == expected  # type: ignore[arg-type]
