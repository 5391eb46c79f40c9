"""A family the checkpoint describes itself (regen.targets.response_template).

- The response templates regen writes into its demo targets (regen.devkit.demo_target
  RESPONSE_TEMPLATES) are read back into a family that agrees with the family module: the same
  reasoning markers, end tokens and call markers; the same text for Kimi and DeepSeek-V3.1
  (their delimiters are literal); for Qwen3, whose call delimiters swallow whitespace with
  ``\\s*``, an answer that parses back (transformers' own parse_response) to the same reasoning,
  content and calls.
- A template of an invented format no module describes gives a family with its markers, end
  tokens, call framing, the engines' parser names and the chat template's switch.
- What cannot be read back, or served, is said, never guessed; a folder with a family module's
  tokens keeps the module; target.family response_template needs a template in the folder.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from regen.core.errors import ConfigError
from regen.core.sample import ToolCall
from regen.devkit.demo_target import RESPONSE_TEMPLATES
from regen.targets import (
    FAMILIES,
    RESPONSE_TEMPLATE,
    TokenizerFacts,
    _precedence,
    recognise,
    target_family,
)
from regen.targets.response_template import ResponseTemplateFamily, delimiters, from_facts

CALLS = (ToolCall("functions.get_weather:0", "get_weather", '{"city": "Oslo"}'),
         ToolCall("functions.get_time:1", "get_time", '{"zone":"CET"}'))  # fmt: skip
#: (state, reasoning, content, calls, finish) of the answers compared
ANSWERS: list[tuple[Any, ...]] = [
    ("open", "Let me think.", "It is sunny.", (), "stop"),
    ("none", "Let me think.", "It is sunny.", (), "stop"),
    ("open", "Two lookups.", "", CALLS[:1], "tool_calls"),
    ("open", "Two lookups.", "Checking.", CALLS, "tool_calls"),
    ("closed", None, "It is sunny.", (), "stop"),
    ("open", "Cut in the", "", (), "length"),
]
#: an invented format: reasoning in <reason>, calls as <call name="...">args</call>, end <|end|>
EMBER: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|assistant|>",
    "fields": {
        "thinking": {"open": "<reason>", "close": "</reason>", "content": "text"},
        "tool_calls": {
            "open_pattern": r'<call name="(?P<name>[^"]+)">',
            "close": "</call>",
            "repeats": True,
            "content": "text",
            "transform": {"type": "function",
                          "function": {"name": "{name}", "arguments": "{content}"}},
        },
        "content": {"close": ["<|end|>", "<|eos|>"], "content": "text"},
    },
}  # fmt: skip
EMBER_TOKENS = frozenset({"<|assistant|>", "<|user|>", "<reason>", "</reason>", "<|end|>",
                          "<|eos|>"})  # fmt: skip


def facts(template: dict[str, Any] | None, tokens: frozenset[str] = EMBER_TOKENS,
          chat: str = "{% if enable_thinking %}<reason>{% endif %}") -> TokenizerFacts:  # fmt: skip
    return TokenizerFacts(chat, tokens, None, template)


def read_back(name: str) -> ResponseTemplateFamily:
    fam = from_facts(facts(RESPONSE_TEMPLATES[name], frozenset()))
    assert fam is not None
    return fam


@pytest.mark.parametrize("name", sorted(RESPONSE_TEMPLATES))
def test_the_demo_targets_templates_agree_with_their_modules(name: str) -> None:
    module, back = FAMILIES[name], read_back(name)
    assert back.think == module.think
    assert set(back.end_tokens()) <= set(module.end_tokens()) and back.end_of_turn == (
        module.end_of_turn)  # fmt: skip
    assert set(back.call_markers) <= set(module.call_markers) | {
        m.strip() for m in back.call_markers}  # fmt: skip
    for state, reasoning, content, calls, finish in ANSWERS:
        theirs = module.response_text(state, reasoning, content, calls, finish)
        mine = back.response_text(state, reasoning, content, calls, finish)
        if name != "qwen3":
            assert mine == theirs
        else:  # \s* in the call delimiters: the whitespace is not in the template
            assert parsed(name, mine, state) == parsed(name, theirs, state)


def parsed(name: str, text: str, state: str) -> dict[str, Any]:
    """transformers' own parse of ``text`` by the demo's template (after a prompt ending in
    ``state``: <think> left open, or not)."""
    from transformers.utils.chat_parsing.response_parser import parse_response

    prefix = "<|im_start|>assistant\n" + ("<think>\n" if state == "open" else "")
    return parse_response(text, RESPONSE_TEMPLATES[name], prefix=prefix)


def test_an_invented_format_is_a_family_with_the_engines_parsers() -> None:
    fam = from_facts(facts(EMBER))
    assert fam is not None and fam.name == RESPONSE_TEMPLATE
    assert (fam.think, fam.end_of_turn, fam.other_ends) == (("<reason>", "</reason>"), "<|end|>",
                                                          ("<|eos|>",))  # fmt: skip
    assert fam.vllm_flags() == ["--enable-auto-tool-choice", "--tool-call-parser", "hf",
                                "--reasoning-parser", "hf"]  # fmt: skip
    assert fam.sglang_flags() == ["--tool-call-parser", "response_template", "--reasoning-parser",
                                  "response_template"]  # fmt: skip
    assert fam.template_kwargs(False) == {"enable_thinking": False}
    assert fam.call_markers == ('<call name="',)
    assert fam.turn_open_tokens == ("<|assistant|>",)
    text = fam.response_text("open", "Hm.", "Ok.", CALLS, "tool_calls")
    assert text == ('Hm.</reason>Ok.<call name="get_weather">{"city": "Oslo"}</call>'
                    '<call name="get_time">{"zone":"CET"}</call><|end|>')  # fmt: skip


def test_a_json_argument_body_comes_back_re_serialized() -> None:
    """The engines return a ``content: json`` body as json.dumps of what it parsed to."""
    spec = json.loads(json.dumps(EMBER))
    spec["fields"]["tool_calls"]["content"] = "json"
    fam = from_facts(facts(spec))
    assert fam is not None
    assert '{"zone": "CET"}' in fam.response_text("none", None, "", CALLS, "tool_calls")


def test_calls_that_cannot_be_read_back_are_said_and_not_guessed(caplog) -> None:
    spec = json.loads(json.dumps(EMBER))
    spec["fields"]["tool_calls"]["open_pattern"] = r'<call [a-z]+="(?P<name>[^"]+)">'
    with caplog.at_level(logging.WARNING, logger="regen.targets.response_template"):
        fam = from_facts(facts(spec))
    assert fam is not None and "cannot be written back" in caplog.text
    assert fam.vllm.tool == "hf"  # it still serves: the server's ids make its rows
    assert fam.response_text("open", "Hm.", "Ok.") == "Hm.</reason>Ok.<|end|>"
    with pytest.raises(Exception, match="character class"):
        fam.response_text("open", "Hm.", "", CALLS, "tool_calls")


def test_a_template_the_engines_do_not_serve_is_no_family(caplog) -> None:
    spec = json.loads(json.dumps(EMBER))
    spec["fields"]["reasoning_content"] = spec["fields"].pop("thinking")
    with caplog.at_level(logging.WARNING, logger="regen.targets.response_template"):
        assert from_facts(facts(spec)) is None
    assert "serve only thinking, content, tool_calls" in caplog.text
    with pytest.raises(ValueError, match="no fields"):
        delimiters({"start_anchor": "x"})


def test_a_family_module_takes_precedence(tmp_path: Path, caplog) -> None:
    kimi_tokens = frozenset(FAMILIES["kimi"].special_tokens)
    _precedence.cache_clear()  # said once per family and process: this test's own saying
    with caplog.at_level(logging.INFO, logger="regen.targets"):
        assert recognise(facts(EMBER, kimi_tokens)) is FAMILIES["kimi"]
    assert "the module is used" in caplog.text
    assert isinstance(recognise(facts(EMBER)), ResponseTemplateFamily)
    assert recognise(facts(None)) is None


def test_target_family_response_template_needs_one_in_the_folder(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "x"}))
    with pytest.raises(ConfigError, match="ships no response_template"):
        target_family(RESPONSE_TEMPLATE, tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "x", "response_template": EMBER})
    )
    fam = target_family(None, tmp_path)  # read_facts caches per path: a new path
    assert fam is None or fam.name == RESPONSE_TEMPLATE
    other = tmp_path / "again"
    other.mkdir()
    (other / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "x", "response_template": EMBER})
    )
    assert target_family(RESPONSE_TEMPLATE, other).name == RESPONSE_TEMPLATE  # type: ignore[union-attr]
