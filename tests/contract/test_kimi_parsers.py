"""SGLang's own Kimi parsers over synthetic model outputs: where a local rebuild of a row
differs from the text the model produced.

A server running ``--reasoning-parser kimi_k2 --tool-call-parser kimi_k2`` reshapes the
model's text before regen sees it: ``parser/reasoning_parser.py`` (``KimiK2Detector``) splits
reasoning from content, and ``function_call/kimik2_detector.py`` pulls the tool calls out of
the content. A local row is rebuilt from those pieces (``regen.targets.kimi.KIMI.response_text``).
Each case runs SGLang's parsers as ``serving_chat.py`` does for a non-streamed answer
(reasoning first, then tool calls; a K2.5 thinking prompt opens ``<think>``, so the output
starts inside the reasoning) and also streamed, token by token. ``serving_chat.py`` itself
does not load on CPU (it needs zmq, fastapi and the scheduler), so its one rule used here is
restated: a kimi_k2 call's id is ``functions.{name}:{history calls + index}``
(``_process_tool_call_id``), whatever id the model wrote.

docs/format.md lists every case below where the rebuild differs; regen flags such rows
(``token_check``) and takes the server's own ids by default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType

import pytest

from regen.core.sample import ToolCall
from regen.targets.kimi import KIMI

response_text = KIMI.response_text

BEGIN, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, ARGS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
IM_END = "<|im_end|>"


def call(cid: str, args: str, ws: str = "") -> str:
    return f"{ws}{CALL}{ws}{cid}{ws}{ARGS}{ws}{args}{ws}{CALL_END}{ws}"


@dataclass(frozen=True)
class Case:
    produced: str  #: what the model wrote after the prompt's open <think> (before <|im_end|>)
    same: bool  #: does the local rebuild give back exactly this text?
    why: str
    same_streamed: bool | None = None  #: when the streamed path differs from the whole one


W = '{"city": "Oslo"}'
CASES = {
    "plain answer": Case("Two and two.</think>It is 4.", True, ""),
    "leading and trailing newlines": Case(
        "\nTwo and two.\n</think>\n\nIt is 4.\n",
        True,
        "kimi_k2 (0.5.23) keeps newlines around </think> in both paths",
    ),
    "tool call after </think>": Case(
        f"Need weather.</think>Checking.{BEGIN}{call('functions.get_weather:0', W)}{END}", True, ""
    ),
    "tool call before </think>": Case(
        f"Need weather.{BEGIN}{call('functions.get_weather:0', W)}{END}",
        False,
        "K2 switches from reasoning to the tool section without </think>; the rebuild inserts one",
    ),
    "newlines inside the tool section": Case(
        f"Need weather.</think>{BEGIN}\n{call('functions.get_weather:0', W, ws=' ')}\n{END}",
        False,
        "whitespace between the section's tokens is dropped",
    ),
    "the model's own call counter": Case(
        f"Need weather.</think>{BEGIN}{call('functions.get_weather:3', W)}{END}",
        False,
        "the id is re-serialized as functions.{name}:{history calls + index}",
    ),
    "a bare counter as id": Case(
        f"Need weather.</think>{BEGIN}{call('2', W)}{END}",
        False,
        "the name is inferred from the arguments and the id re-serialized",
    ),
    "text after the tool section": Case(
        f"Need weather.</think>{BEGIN}{call('functions.get_weather:0', W)}{END}Done.",
        False,
        "text after the section is dropped (streamed: moved into content)",
    ),
    "arguments that are not an object": Case(
        f"Need weather.</think>{BEGIN}{call('functions.get_weather:0', '[1]')}{END}",
        False,
        "non-streamed, the call is not parsed and the section disappears (streamed, the "
        "arguments pass as they are)",
        same_streamed=True,
    ),
    "<think> written again after the open prompt": Case(
        "<think>Two and two.</think>It is 4.", False, "the leading <think> is stripped"
    ),
}


@pytest.fixture(scope="module")
def tools(protocol: ModuleType) -> list:
    fn = protocol.Function(name="get_weather", parameters={
        "type": "object", "properties": {"city": {"type": "string"}}})  # fmt: skip
    return [protocol.Tool(function=fn)]


def parse_whole(rp: ModuleType, fc: ModuleType, tools: list, text: str, history: int = 0):
    """serving_chat's non-streamed path: reasoning parser, then the tool-call parser."""
    reasoning, normal = rp.ReasoningParser(
        "kimi_k2", stream_reasoning=False, force_reasoning=True
    ).parse_non_stream(text)
    calls: list[ToolCall] = []
    det = fc.KimiK2Detector()
    if det.has_tool_call(normal):
        res = det.detect_and_parse(normal, tools)
        if res.calls:  # no complete call parsed: serving_chat keeps the text, drops the section
            normal = res.normal_text
            calls = [ToolCall(f"functions.{c.name}:{history + i}", c.name, c.parameters)
                     for i, c in enumerate(res.calls)]  # fmt: skip
        else:
            normal = res.normal_text
    return reasoning, normal or "", calls


def pieces(text: str) -> list[str]:
    """Token-sized pieces: special tokens whole, other text 1-4 characters at a time."""
    return re.findall(r"<\|[a-z_]+\|>|</?think>|[^<]{1,4}|<", text)


def parse_streamed(rp: ModuleType, fc: ModuleType, tools: list, text: str, history: int = 0):
    """serving_chat's streamed path: each piece through the reasoning parser, its normal text
    through the tool-call parser; deltas assembled as a client does."""
    r = rp.ReasoningParser("kimi_k2", stream_reasoning=True, force_reasoning=True)
    det = fc.KimiK2Detector()
    reasoning, content, calls = [], [], {}
    for p in pieces(text):
        thought, normal = r.parse_stream_chunk(p)
        reasoning.append(thought or "")
        if normal:
            res = det.parse_streaming_increment(normal, tools)
            content.append(res.normal_text or "")
            for c in res.calls:
                slot = calls.setdefault(c.tool_index, ["", ""])
                slot[0] = c.name or slot[0]
                slot[1] += c.parameters or ""
    out = [ToolCall(f"functions.{n}:{history + i}", n, a) for i, (n, a) in sorted(calls.items())]
    return "".join(reasoning), "".join(content), out


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("path", ["whole", "streamed"])
def test_a_local_rebuild_against_the_produced_text(
    reasoning_parser, kimik2_detector, tools, name, path
) -> None:
    case = CASES[name]
    parse = parse_whole if path == "whole" else parse_streamed
    reasoning, content, calls = parse(reasoning_parser, kimik2_detector, tools, case.produced)
    rebuilt = response_text("open", reasoning, content, calls)
    produced = case.produced + IM_END
    same = case.same if path == "whole" or case.same_streamed is None else case.same_streamed
    if same:
        assert rebuilt == produced
    else:
        assert rebuilt != produced, f"{name}: expected a difference ({case.why})"


def test_what_the_parsers_return_for_the_differing_cases(
    reasoning_parser, kimik2_detector, tools
) -> None:
    """The pieces behind the differences, pinned (non-streamed)."""

    def whole(name: str):
        return parse_whole(reasoning_parser, kimik2_detector, tools, CASES[name].produced)

    r, c, calls = whole("tool call before </think>")
    assert (r, c, [x.name for x in calls]) == ("Need weather.", "", ["get_weather"])
    assert whole("the model's own call counter")[2][0].id == "functions.get_weather:0"
    assert whole("a bare counter as id")[2][0].name == "get_weather"
    assert whole("text after the tool section")[1] == ""
    assert whole("arguments that are not an object")[2] == []
    assert whole("<think> written again after the open prompt")[0] == "Two and two."
    assert whole("newlines inside the tool section")[2][0].arguments == W
    assert whole("leading and trailing newlines")[:2] == ("\nTwo and two.\n", "\n\nIt is 4.\n")
