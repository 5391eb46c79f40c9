"""What an engine's defaults make a model write, where that is not the model's own format.

vLLM 0.32 serves ``--tool-call-parser glm45`` with its GLM-4.7 parser and, by default
(``VLLM_ENFORCE_STRICT_TOOL_CALLING``), constrains tool calls with that parser's grammar: a
GLM-4.5 model served so writes GLM-4.7's calls (no newlines inside). Measured on the GLM-4.5
demo target (tests/engines/test_families_vllm.py); the grammar is
``tool_parsers/structural_tag_registry.py`` ``_glm_4_7_tool_tag``. A server row holds those ids;
its cross-check accepts that form from vLLM, and only from vLLM.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _families import TINY

from regen.core.result import TurnResult
from regen.core.sample import Message, Sample, ToolCall
from regen.engine.rows import build_turn_row
from regen.targets import FAMILIES
from regen.targets.glm import GLM45_ON_VLLM
from regen.template.render import Renderer
from regen.template.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[2]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {"name": "get_weather", "description": "Weather.", "parameters": CITY}
TOOLS = [{"type": "function", "function": WEATHER}]
CALL = ToolCall("c0", "get_weather", '{"city": "Oslo"}')
#: what the GLM-4.5 demo target wrote on vLLM 0.32 (after the open prompt's <|assistant|>)
SERVED = ("\n<think>The user needs a tool for this.</think>\n<tool_call>get_weather<arg_key>city"
          "</arg_key><arg_value>Oslo</arg_value></tool_call><|observation|>")  # fmt: skip


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    fam = FAMILIES["glm45"]
    return Renderer(load_tokenizer(TINY["glm45"]), fam.template_kwargs(True), fam)


def row_of(renderer: Renderer, engine: str) -> dict:
    msgs = [Message("user", "Weather in Oslo?")]
    prompt = renderer.encode(renderer.render_prompt(msgs, TOOLS, engine))
    result = TurnResult(
        content="", reasoning="\nThe user needs a tool for this.", tool_calls=(CALL,),
        finish_reason="tool_calls", model="m", endpoint="http://127.0.0.1:9/v1",
        prompt_token_ids=prompt, output_token_ids=renderer.encode(SERVED), engine=engine,
    )  # fmt: skip
    sample = Sample(id="s:1", source="s", messages=[*msgs, Message("assistant", "x")],
                    tools=TOOLS)  # fmt: skip
    return build_turn_row(sample, 0, msgs, result, renderer)


def test_glm45_on_vllm_writes_glm47s_calls(renderer: Renderer) -> None:
    own = FAMILIES["glm45"].response_text("none", "The user needs a tool for this.", "", (CALL,),
                                          "tool_calls")  # fmt: skip
    assert "<tool_call>get_weather\n<arg_key>" in own  # the model's own form
    assert FAMILIES["glm45"].served_variant("vllm") is GLM45_ON_VLLM
    assert FAMILIES["glm45"].served_variant("sglang") is None
    assert FAMILIES["glm47"].served_variant("vllm") is None  # already its own form
    got = GLM45_ON_VLLM.response_text("none", "The user needs a tool for this.", "", (CALL,),
                                      "tool_calls")  # fmt: skip
    assert got == SERVED


def test_the_cross_check_accepts_that_form_from_vllm_only(renderer: Renderer) -> None:
    row = row_of(renderer, "vllm")
    assert row["token_source"] == "server" and row["token_check"] == "match"
    assert row["text"] == renderer.decode(row["input_ids"])  # the server's text, not the own form
    assert row_of(renderer, "sglang")["token_check"] == "response_mismatch"
