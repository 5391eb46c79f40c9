"""MiniMax-M3's text round trip through both engines' own parsers, per thinking mode: the text
the model writes after ``]~b]ai\\n`` + the mode's prefill (``<mm:think>`` enabled,
``</mm:think>`` disabled, nothing adaptive) → SGLang 0.5.23 (``minimax-m3`` reasoning and tools,
the reasoning forced open exactly when ``thinking_mode`` is ``enabled``, as serving_chat does)
or vLLM 0.32 (``minimax_m3`` reasoning and tools, the parser its chat serving composes) →
(reasoning, content, calls) → ``MINIMAX_M3.response_text`` → the same text, and the same ids
through a tokenizer holding M3's tokens.

There is no MiniMax-M3 chat template to render (regen/targets/minimax_m3.py): these tests cover
the output format only; the whitespace between call tags is the one replies show in public
reports, and a case names the form the rebuild does not write."""

from __future__ import annotations

from pathlib import Path

import pytest
from _engines import (
    TIME,
    Case,
    check,
    rebuild,
    same_ids,
    sglang,
    sglang_parse,
    strip_end,
    vllm_parse,
    vllm_round_trip,
)

from regen.targets.family import ThinkState, TokenizerFacts
from regen.targets.minimax_m2 import MINIMAX_M2
from regen.targets.minimax_m2 import SPECIAL_TOKENS as M2_SPECIAL
from regen.targets.minimax_m3 import MINIMAX_M3, NS, SPECIAL_TOKENS

TEMPLATES = Path(__file__).resolve().parents[2] / "regen/devkit/tokenizers/templates"
EN, DIS, AD = ({"thinking_mode": m} for m in ("enabled", "disabled", "adaptive"))
END = "[e~["
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "opts": {"type": "object", "properties": {"u": {"type": "string"}}},
        "tags": {"type": "array", "items": {"type": "string"}}}}}}  # fmt: skip
TOOLS = [WEATHER, TIME]


def el(name: str, body: str) -> str:
    return f"{NS}<{name}>{body}{NS}</{name}>"


def invoke(name: str, params: str = "") -> str:
    return f'{NS}<invoke name="{name}">{params}{NS}</invoke>\n'


def block(*invokes: str) -> str:
    return f"{NS}<tool_call>\n{''.join(invokes)}{NS}</tool_call>"


W = invoke("get_weather", el("city", "Oslo"))
T = invoke("get_time", el("zone", "CET"))
NESTED = invoke("get_weather", el("city", "Oslo") + el("days", "3") + el("opts", el("u", "C"))
                + el("tags", el("item", "rain") + el("item", "wind")))  # fmt: skip
SPACED = (f'{NS}<tool_call>\n{NS}<invoke name="get_weather">\n{el("city", "Oslo")}\n'
          f"{NS}</invoke>\n{NS}</tool_call>")  # fmt: skip
R = "The user asks the weather.</mm:think>"
CASES = {
    "enabled: reasoning and answer": Case(f"{R}It is sunny.{END}", "open", kwargs=EN),
    "enabled: a call": Case(f"{R}{block(W)}{END}", "open", calls=1, kwargs=EN),
    "enabled: two calls": Case(f"{R}{block(W, T)}{END}", "open", calls=2, kwargs=EN),
    "enabled: content before a call": Case(f"{R}Let me check.\n{block(W)}{END}", "open",
                                           calls=1, kwargs=EN),
    "enabled: nested arguments": Case(f"{R}{block(NESTED)}{END}", "open", calls=1, kwargs=EN),
    "enabled: a call without arguments": Case(f"{R}{block(invoke('get_time'))}{END}", "open",
                                              calls=1, kwargs=EN),
    "enabled: cut in the reasoning": Case("The user asks", "open", "length", kwargs=EN),
    "enabled: cut in the answer": Case(f"{R}It is su", "open", "length", kwargs=EN),
    "disabled: answer": Case(f"It is sunny.{END}", "closed", kwargs=DIS),
    "disabled: a call": Case(f"Checking.\n{block(W)}{END}", "closed", calls=1, kwargs=DIS),
    "adaptive: thinks": Case(f"<mm:think>{R}It is sunny.{END}", kwargs=AD),
    "adaptive: answers directly": Case(f"It is sunny.{END}", kwargs=AD),
    "adaptive: thinks, then a call": Case(f"<mm:think>{R}{block(W)}{END}", calls=1, kwargs=AD),
    "adaptive: cut in the reasoning": Case("<mm:think>The user asks", "none", "length",
                                           kwargs=AD),
    "adaptive: an empty think block": Case(f"<mm:think></mm:think>It is sunny.{END}",
        kwargs=AD, sglang_differs="SGLang returns '' reasoning for an empty block and for none",
        vllm_differs="vLLM returns '' reasoning: the rebuild reads it as none (SGLang's '')"),
    "adaptive: a stray closer": Case(f"</mm:think>It is sunny.{END}", kwargs=AD,
        sglang_differs="SGLang drops the </mm:think> a non-thinking reply opens with",
        vllm_differs="vLLM drops the </mm:think> a non-thinking reply opens with"),
    "text after the calls": Case(f"{R}{block(W)}Done.{END}", "open", calls=1, kwargs=EN,
        sglang_differs="SGLang appends text after the calls to the content",
        vllm_differs="vLLM drops text after the calls"),
    "arguments on their own lines": Case(f"{R}{SPACED}{END}", "open", calls=1, kwargs=EN,
        sglang_differs="the rebuild writes no whitespace inside an <invoke> (the whitespace "
                       "is not in the parsed call)",
        vllm_differs="the rebuild writes no whitespace inside an <invoke> (the whitespace is "
                     "not in the parsed call)"),
}  # fmt: skip
SPECIAL = list(SPECIAL_TOKENS)
#: M3's added tokens that are not special: ``]<]minimax[>[`` (vLLM ``parser/minimax_m3.py``
#: says so; were it special, vLLM's M3 tool parser, whose engine pre-lexes special tokens, would
#: return every call with ``{}`` arguments: seen when run so) and the think markers (vLLM's M3
#: parsers leave ``skip_special_tokens`` on, so special markers would never reach its reasoning
#: parser)
NOT_SPECIAL = ["<mm:think>", "</mm:think>", NS]
VLLM_SPECIAL = [t for t in SPECIAL if t not in NOT_SPECIAL]


def sglang_round_trip(case: Case) -> str:
    """The case through SGLang's parsers, the reasoning forced open for ``enabled`` only
    (serving_chat ``_get_reasoning_from_request``), and back."""
    force = case.kwargs.get("thinking_mode") == "enabled"
    detector = sglang("function_call.minimax_m3").MinimaxM3Detector()
    reasoning, content, calls = sglang_parse(
        strip_end(MINIMAX_M3, case.text), MINIMAX_M3.sglang.reasoning, detector, force=force,
        tools=TOOLS,
    )  # fmt: skip
    assert len(calls) == case.calls or case.sglang_differs, (reasoning, content, calls)
    return rebuild(MINIMAX_M3, case, reasoning, content, calls)


@pytest.mark.parametrize("name", list(CASES))
def test_sglang_round_trip(name: str) -> None:
    case = CASES[name]
    check(case, sglang_round_trip(case), case.sglang_differs)


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, dict]:
    found = vllm_parse(MINIMAX_M3, list(CASES.values()), VLLM_SPECIAL, composed=True,
                       tools=TOOLS, added=NOT_SPECIAL)  # fmt: skip
    return dict(zip(CASES, found, strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_round_trip(vllm_results, name: str) -> None:
    case = CASES[name]
    check(case, vllm_round_trip(MINIMAX_M3, case, vllm_results[name]), case.vllm_differs)


def test_vllm_leaves_special_tokens_skipped(vllm_results) -> None:
    """vLLM's M3 parsers keep ``skip_special_tokens`` on (their markers are not special
    tokens): a special marker would be cut from the text before any parser saw it."""
    assert {r["skip_special_tokens"] for r in vllm_results.values()} == {True}


def test_ids_of_the_rebuilt_text() -> None:
    for name, case in CASES.items():
        if not case.sglang_differs:
            assert same_ids(SPECIAL, case.text, sglang_round_trip(case)), name


@pytest.mark.parametrize(
    ("thinking", "mode", "tail", "state"),
    [(True, "enabled", "<mm:think>", "open"), ("enabled", "enabled", "<mm:think>", "open"),
     (False, "disabled", "</mm:think>", "closed"), ("adaptive", "adaptive", "", "none")],
)  # fmt: skip
def test_thinking_is_the_thinking_mode(
    thinking: bool | str, mode: str, tail: str, state: ThinkState
) -> None:
    """``sampling.thinking`` → ``thinking_mode``, and the state of the prompt that mode ends
    (``]~b]ai\\n`` + the mode's prefill, as the template's generation prompt writes it)."""
    assert MINIMAX_M3.template_kwargs(thinking) == {"thinking_mode": mode}
    assert MINIMAX_M3.think_state(f"]~b]user\nHi[e~[\n]~b]ai\n{tail}") == state


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="adaptive"):
        MINIMAX_M3.template_kwargs("max")


# -- recognition: M2 and M3 share ]~!b[, ]~b] and [e~[; M3 is tried first ------------------------
M2_TOKENS = frozenset({*M2_SPECIAL, "]!p~[", "]!d~["})
#: an M3 tokenizer keeps M2's added tokens (same vocabulary size) and adds its own
M3_TOKENS = M2_TOKENS | {"<mm:think>", "</mm:think>", NS}
M2_TEMPLATE = (TEMPLATES / "minimax_m2.jinja").read_text(encoding="utf-8")
TEMPLATE_LESS_M3 = TokenizerFacts(chat_template="", tokens=M3_TOKENS, model_type=None)
#: the parts of M3's template that SGLang's rule and the family read (public copies quote them;
#: the template itself was not available)
M3_TEMPLATE = (
    "{%- set think_begin_token = '<mm:think>' -%}{%- set think_end_token = '</mm:think>' -%}"
    "{%- if thinking_mode is defined and thinking_mode == 'disabled' -%}"
    "{{- think_end_token }}{%- endif -%}{{- ']<]minimax[>[<tool_call>' }}"
)


def minimax(facts: TokenizerFacts) -> str | None:
    """The family the registry finds when it tries M3 before M2 (the order it must register
    them in); the two disagree on every folder but one (test_m2_alone_...)."""
    found = [f.name for f in (MINIMAX_M3, MINIMAX_M2) if f.recognises(facts)]
    assert len(found) <= 1 or facts == TEMPLATE_LESS_M3, found
    return found[0] if found else None


@pytest.mark.parametrize(
    ("tokens", "template", "model_type", "found"),
    [
        (M3_TOKENS, M3_TEMPLATE, "minimax_m3_vl", "minimax_m3"),
        (M3_TOKENS, M3_TEMPLATE, "minimax_m3", "minimax_m3"),
        (M3_TOKENS, M3_TEMPLATE, None, "minimax_m3"),
        (M3_TOKENS, "", None, "minimax_m3"),  # M3's think tokens
        (M3_TOKENS, "", "minimax_m3_vl", "minimax_m3"),
        (M2_TOKENS, M2_TEMPLATE, "minimax_m2", "minimax_m2"),
        (M2_TOKENS, M2_TEMPLATE, None, "minimax_m2"),
        (M2_TOKENS, "", None, "minimax_m2"),
        (M3_TOKENS, M2_TEMPLATE, "minimax_m2", "minimax_m2"),  # config and template say M2
        (M2_TOKENS, M3_TEMPLATE, "minimax_m2", None),  # they disagree: neither
        (M2_TOKENS, M2_TEMPLATE, "minimax", None),  # MiniMax-Text-01 / M1: neither
    ],
)  # fmt: skip
def test_m3_is_told_from_m2(
    tokens: frozenset[str], template: str, model_type: str | None, found: str | None
) -> None:
    facts = TokenizerFacts(chat_template=template, tokens=tokens, model_type=model_type)
    assert minimax(facts) == found


def test_m2_alone_takes_a_template_less_m3_folder() -> None:
    """Why M3 must be registered before M2: an M3 tokenizer holds M2's tokens, and a folder
    without template or config.json says nothing else (M2's module cannot ask M3's, which
    builds on it)."""
    assert MINIMAX_M2.recognises(TEMPLATE_LESS_M3) and MINIMAX_M3.recognises(TEMPLATE_LESS_M3)


def test_neither_takes_another_familys_folder() -> None:
    facts = TokenizerFacts(chat_template=M3_TEMPLATE, tokens=frozenset({"<|im_start|>"}),
                           model_type=None)  # fmt: skip
    assert minimax(facts) is None
