"""Shared by the family contract tests: SGLang's parsers loaded from the wheel, vLLM's parsers
run by the vLLM environment's worker process (``_vllm_call.py``), a tiny tokenizer holding a
family's special tokens, and one case record.

A case is the text a model writes after its generation prompt; each test sends it through an
engine's own parsers (reasoning first, then tool calls, as the servers do), rebuilds the text
with the family's ``response_text`` and compares.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers

from regen.core.sample import ToolCall
from regen.targets.family import Family, ThinkState

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "contract"))
sys.path.insert(0, str(HERE.parent / "engines"))

import _sglang  # noqa: E402
from _vllm_call import vllm_call  # noqa: E402

#: the tool every case may call, and a second one
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}}}}  # fmt: skip
TOOLS = [WEATHER, TIME]
#: seconds a vLLM worker call may take (the worker's first call imports vLLM: about 10 s)
VLLM_TIMEOUT_S = 180


@dataclass(frozen=True)
class Case:
    """A model's output after a prompt in ``state``, how it ended, and the calls it holds."""

    text: str  #: what the model wrote, end token included when it ended
    state: ThinkState = "none"
    finish: str = "stop"
    calls: int = 0  #: how many calls the parsers should find
    #: the parsers' chat_template_kwargs (thinking on or off)
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: why SGLang's / vLLM's parsers cannot give this text back ('': they do)
    sglang_differs: str = ""
    vllm_differs: str = ""


def sglang(name: str) -> ModuleType:
    """A module of the SGLang wheel (``sglang.srt.<name>``)."""
    return _sglang.load(f"sglang.srt.{name}")


def sglang_tools(tools: list[dict] | None = None) -> list:
    """``tools`` (:data:`TOOLS`) as SGLang's protocol objects."""
    protocol = sglang("entrypoints.openai.protocol")
    return [
        protocol.Tool(function=protocol.Function(
            name=t["function"]["name"], parameters=t["function"]["parameters"]))
        for t in (TOOLS if tools is None else tools)
    ]  # fmt: skip


def sglang_parse(
    text: str, reasoning: str | None, detector: Any, force: bool = False,
    tools: list[dict] | None = None,
) -> tuple[str | None, str, list[ToolCall]]:  # fmt: skip
    """serving_chat's non-streamed path: the reasoning parser (``reasoning``: its name), then
    the tool detector on the normal text; calls named ``call_{i}``; ``tools``: the request's
    tools (:data:`TOOLS`)."""
    thought: str | None = None
    normal = text
    if reasoning is not None:
        rp = sglang("parser.reasoning_parser")
        thought, normal = rp.ReasoningParser(
            reasoning, stream_reasoning=False, force_reasoning=force
        ).parse_non_stream(text)
        normal = normal or ""
    calls: list[ToolCall] = []
    if detector is not None and detector.has_tool_call(normal):
        res = detector.detect_and_parse(normal, sglang_tools(tools))
        if res.calls:
            normal = res.normal_text
            calls = [ToolCall(f"call_{i}", c.name, c.parameters) for i, c in enumerate(res.calls)]
    return thought, normal, calls


def vllm_parse(
    family: Family, cases: Sequence[Case], special: Sequence[str], *, composed: bool = False,
    tools: list[dict] | None = None, added: Sequence[str] = (),
) -> list[dict]:  # fmt: skip
    """Every case through vLLM's parsers for ``family``, in one call of the vLLM environment's
    worker (skips when that environment is missing); ``composed``: through the parser vLLM's
    chat serving composes from the two names (_vllm_parse.py); ``tools``: the request's tools
    (:data:`TOOLS`); ``added``: the tokenizer's added tokens that are not special."""
    job = {
        "special": list(special),
        "added": list(added),
        "tools": TOOLS if tools is None else tools,
        "cases": [
            {"text": strip_end(family, c.text), "reasoning": family.vllm.reasoning,
             "tool": family.vllm.tool, "kwargs": c.kwargs, "composed": composed}
            for c in cases
        ],
    }  # fmt: skip
    return vllm_call(HERE / "_vllm_parse.py", job, timeout_s=VLLM_TIMEOUT_S)


def sglang_round_trip(family: Family, case: Case, detector: Any) -> str:
    """The case through SGLang's parsers for ``family`` and back (the server forces the
    reasoning open when the request's thinking switch is on)."""
    force = bool(case.kwargs.get(family.thinking_kwarg or "", False))
    reasoning, content, calls = sglang_parse(
        strip_end(family, case.text), family.sglang.reasoning, detector, force=force
    )
    assert len(calls) == case.calls or case.sglang_differs, (reasoning, content, calls)
    return rebuild(family, case, reasoning, content, calls)


def vllm_round_trip(family: Family, case: Case, result: dict) -> str:
    """A vLLM worker result for the case, rebuilt."""
    assert "error" not in result, result
    calls = vllm_calls(result)
    assert len(calls) == case.calls or case.vllm_differs, result
    return rebuild(family, case, result["reasoning"], result["content"], calls)


def check(case: Case, rebuilt: str, differs: str) -> None:
    """The rebuild equals the model's text, or differs where the case says it must."""
    if differs:
        assert rebuilt != case.text, f"expected a difference: {differs}"
    else:
        assert rebuilt == case.text


def strip_end(family: Family, text: str) -> str:
    """The text a server's parsers see: the end token is a stop token, not output."""
    for end in family.end_tokens():
        if text.endswith(end):
            return text[: -len(end)]
    return text


def vllm_calls(result: dict) -> list[ToolCall]:
    return [ToolCall(f"call_{i}", n, a) for i, (n, a) in enumerate(result["calls"])]


def rebuild(family: Family, case: Case, reasoning: str | None, content: str | None,
            calls: Sequence[ToolCall]) -> str:  # fmt: skip
    """The family's reassembly of what an engine returned."""
    return family.response_text(case.state, reasoning, content or "", calls, case.finish)


def tiny_tokenizer(special: Sequence[str], texts: Sequence[str]) -> Tokenizer:
    """A one-character-per-token WordLevel tokenizer over the characters of ``texts``, whose
    added special tokens (``special=True``) are ``special``."""
    chars = sorted({ch for t in texts for ch in t})
    tk = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, **{c: i + 1 for i, c in enumerate(chars)}},
                                    unk_token="[UNK]"))  # fmt: skip
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tk


def same_ids(special: Sequence[str], produced: str, rebuilt: str) -> bool:
    """Whether the tiny tokenizer gives ``produced`` and ``rebuilt`` the same ids (and the
    special tokens were split out as one id each)."""
    tk = tiny_tokenizer(special, [produced, rebuilt])
    a, b = tk.encode(produced).ids, tk.encode(rebuilt).ids
    assert 0 not in a, "a character fell outside the vocabulary"
    assert len(a) < len(produced) or not any(s in produced for s in special)
    return a == b
