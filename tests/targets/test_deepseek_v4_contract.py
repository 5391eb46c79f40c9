"""DeepSeek-V4 and V4.1 against both engines' own code (the two differ in their call markup,
:class:`_dsml.Markup`, their effort line and a few prompt edges; every test runs for each).

- The answer's text round trip: the text the model writes after its generation prompt →
  SGLang 0.5.23 (its deepseek-recipe adapter, ``deepseek-v4`` / ``deepseekv4`` and
  ``deepseek-v41`` / ``deepseekv41``: recipe's token-level parser over the ids) or vLLM 0.32
  (the ``deepseek_v4`` / ``deepseek_v41`` engine parser) → (reasoning, content, calls) → the
  family's ``response_text`` → the same text, and the same ids.
- The prompt: regen's Renderer gives the text and ids each engine renders for the same
  request, thinking on (effort ``high``), off, ``low`` and ``max``: SGLang's adapter over
  deepseek-recipe in this process, vLLM's server renderer (``--tokenizer-mode deepseek_v4`` /
  ``deepseek_v41``) in the vLLM environment's worker (tests/_vllm_call.py); where the two part
  ways (:data:`_dsml.EDGES`) regen follows each.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _dsml import (
    CONVERSATIONS,
    EDGES,
    TOKENS,
    TOOLS,
    V4_MARKUP,
    V41_MARKUP,
    Markup,
    assistant,
    build_tokenizer,
    call,
    prompt_jobs,
    recipe_adapter,
    recipe_round_trip,
    regen_render,
    request,
    sglang_recipe_prompt,
    user,
    vllm_renders,
)
from _engines import TOOLS as PARSE_TOOLS
from _engines import Case, check, same_ids, vllm_parse, vllm_round_trip
from transformers import AutoTokenizer

from regen.core.errors import TemplateError
from regen.targets.deepseek_v4 import DEEPSEEK_V4
from regen.targets.deepseek_v41 import DEEPSEEK_V41
from regen.targets.family import Family

EOS = "<｜end▁of▁sentence｜>"
SPECIAL = [t for t, _ in TOKENS]
STRIPS = "SGLang (recipe) strips the newlines that open the reasoning and the answer"


@dataclass(frozen=True, slots=True)
class Version:
    family: Family
    recipe: str  #: the SGLang adapter's encoding name
    markup: Markup
    #: prompts the two engines render apart beyond :data:`DIFFERENT`
    different: tuple[str, ...] = ()


VERSIONS = {
    "V4": Version(DEEPSEEK_V4, "dsv4", V4_MARKUP),
    "V4.1": Version(DEEPSEEK_V41, "dsv41", V41_MARKUP,
                    ("an empty system message / no thinking",
                     "a system message, then an answer / no thinking")),
}  # fmt: skip


def answers(v: Version) -> dict[str, Case]:
    """The answers of the round trip, in ``v``'s markup."""
    on, off = v.family.template_kwargs(True), v.family.template_kwargs(False)
    invoke, block = v.markup.invoke, v.markup.calls
    w = invoke("get_weather", ("city", "true", "Zürich"), ("days", "false", "2"),
               ("options", "false", '{"units": "°C", "list": [1, 2.5, null, true]}'))  # fmt: skip
    t = invoke("get_time", ("zone", "true", "CET"))
    spaced = invoke("get_time", ("zone", "true", " CET \n"))
    compact = invoke("get_time", ("zone", "false", "[1,2]"))
    return {
        "reasoning and answer": Case(f"Need the weather.</think>It is sunny.{EOS}", "open",
                                     kwargs=on),
        "newlines": Case(f"\nNeed it.\n</think>\n\nIt is sunny.\n{EOS}", "open", kwargs=on,
                         sglang_differs=STRIPS,
                         vllm_differs="vLLM strips the whitespace that ends the reasoning"),
        "thinking off": Case(f"It is sunny.{EOS}", "closed", kwargs=off),
        "one call": Case(f"Need it.</think>\n\n{block(w)}{EOS}", "open", calls=1, kwargs=on),
        "two calls": Case(f"Need both.</think>\n\n{block(w, t)}{EOS}", "open", calls=2,
                          kwargs=on),
        "content before a call": Case(f"Need it.</think>Let me check.\n\n{block(w)}{EOS}",
                                      "open", calls=1, kwargs=on),
        "a call, thinking off": Case(f"Checking.\n\n{block(w)}{EOS}", "closed", calls=1,
                                     kwargs=off),
        "cut in the reasoning": Case("Need the wea", "open", finish="length", kwargs=on),
        "cut in the answer": Case("Need it.</think>It is su", "open", finish="length",
                                  kwargs=on),
        "spaces around a string value": Case(f"Need it.</think>\n\n{block(spaced)}{EOS}",
                                             "open", calls=1, kwargs=on),
        "a compact JSON value": Case(
            f"Need it.</think>\n\n{block(compact)}{EOS}", "open", calls=1, kwargs=on,
            sglang_differs="the value is re-dumped with spaces",
            vllm_differs="the value is re-dumped with spaces"),
        "no blank line before the calls": Case(
            f"Need it.</think>Let me check.{block(w)}{EOS}", "open", calls=1, kwargs=on,
            sglang_differs="the rebuild writes the encoder's \\n\\n before the block",
            vllm_differs="the rebuild writes the encoder's \\n\\n before the block"),
    }  # fmt: skip


CASES = {v: answers(version) for v, version in VERSIONS.items()}
EACH_CASE = [(v, name) for v, cases in CASES.items() for name in cases]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("dsv4") / "tok")


@pytest.fixture(scope="module")
def hf(folder):
    return AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def adapters(hf) -> dict[str, Any]:
    return {v: recipe_adapter(version.recipe, hf) for v, version in VERSIONS.items()}


# -- the answer -------------------------------------------------------------------------------
@pytest.mark.parametrize(("v", "name"), EACH_CASE)
def test_sglang_round_trip(adapters, hf, v: str, name: str) -> None:
    case = CASES[v][name]
    rebuilt = recipe_round_trip(VERSIONS[v].family, case, adapters[v], hf, PARSE_TOOLS)
    check(case, rebuilt, case.sglang_differs)


@pytest.fixture(scope="module")
def vllm_results() -> dict[tuple[str, str], dict]:
    out: dict[tuple[str, str], dict] = {}
    for v, cases in CASES.items():
        got = vllm_parse(VERSIONS[v].family, list(cases.values()), SPECIAL, composed=True)
        out.update({(v, name): r for name, r in zip(cases, got, strict=True)})
    return out


@pytest.mark.parametrize(("v", "name"), EACH_CASE)
def test_vllm_round_trip(vllm_results, v: str, name: str) -> None:
    case = CASES[v][name]
    rebuilt = vllm_round_trip(VERSIONS[v].family, case, vllm_results[(v, name)])
    check(case, rebuilt, case.vllm_differs)


@pytest.mark.parametrize("v", list(VERSIONS))
def test_ids_of_the_rebuilt_text(adapters, hf, v: str) -> None:
    for name, case in CASES[v].items():
        if not case.sglang_differs:
            rebuilt = recipe_round_trip(VERSIONS[v].family, case, adapters[v], hf, PARSE_TOOLS)
            assert same_ids(SPECIAL, case.text, rebuilt), name


# -- the prompt -------------------------------------------------------------------------------
SETTINGS = {
    "thinking": (True, None),
    "no thinking": (False, None),
    "effort low": ("low", None),
    "effort max": ("max", None),
    "thinking, vLLM's drop_thinking off": (True, {"drop_thinking": False}),
}
JOBS = {
    v: {
        **prompt_jobs(version.family, SETTINGS, CONVERSATIONS),
        **prompt_jobs(version.family, {"thinking": (True, None), "no thinking": (False, None)},
                      EDGES),
    }
    for v, version in VERSIONS.items()
}  # fmt: skip
EACH_JOB = [(v, name) for v, jobs in JOBS.items() for name in jobs]
#: where the two engines' prompts differ, and what regen must follow in each
DIFFERENT = [
    "a developer message mid-conversation / thinking",
    "a later system message, tools / no thinking",
    "two answers in a row / no thinking",
    "history arguments that are not an object / thinking",
    "numbers in the arguments / no thinking",
    "thinking, vLLM's drop_thinking off",
]
EACH_DIFFERENT = [(v, name) for v, version in VERSIONS.items()
                  for name in [*DIFFERENT, *version.different]]  # fmt: skip


@pytest.fixture(scope="module")
def vllm_prompts(folder) -> dict[tuple[str, str], dict]:
    out: dict[tuple[str, str], dict] = {}
    for v, jobs in JOBS.items():
        mode = VERSIONS[v].family.vllm_tokenizer_mode
        got = vllm_renders(folder, [{"mode": mode, "body": body} for body, _ in jobs.values()])
        out.update({(v, name): r for name, r in zip(jobs, got, strict=True)})
    return out


@pytest.mark.parametrize(("v", "name"), EACH_JOB)
def test_the_prompt_is_sglangs(folder, hf, adapters, v: str, name: str) -> None:
    body, kwargs = JOBS[v][name]
    text, ids = regen_render(folder, VERSIONS[v].family, body, kwargs, "sglang")
    assert (text, ids) == sglang_recipe_prompt(body, adapters[v], hf)


@pytest.mark.parametrize(("v", "name"), EACH_JOB)
def test_the_prompt_is_vllms(folder, vllm_prompts, v: str, name: str) -> None:
    body, kwargs = JOBS[v][name]
    text, ids = regen_render(folder, VERSIONS[v].family, body, kwargs, "vllm")
    got = vllm_prompts[(v, name)]
    assert (text, ids) == (got["prompt"], got["ids"])


@pytest.mark.parametrize(("v", "name"), EACH_DIFFERENT)
def test_where_the_engines_part_ways(hf, adapters, vllm_prompts, v: str, name: str) -> None:
    if name in JOBS[v]:
        sglang_text = sglang_recipe_prompt(JOBS[v][name][0], adapters[v], hf)[0]
        assert sglang_text != vllm_prompts[(v, name)]["prompt"]
        return
    changed = [k for k in JOBS[v] if k.endswith(f"/ {name}")]  # a vLLM-only kwarg
    assert any(vllm_prompts[(v, k)]["prompt"]
               != vllm_prompts[(v, k.replace(name, "thinking"))]["prompt"]
               for k in changed)  # fmt: skip


@pytest.mark.parametrize("v", list(VERSIONS))
def test_plain_and_legacy_render_as_vllm(folder, vllm_prompts, v: str) -> None:
    name = "system, tools, calls, results, next user turn / effort max"
    body, kwargs = JOBS[v][name]
    for engine in ("plain", "legacy"):
        assert regen_render(folder, VERSIONS[v].family, body, kwargs, engine)[0] == (
            vllm_prompts[(v, name)]["prompt"]), engine  # fmt: skip


@pytest.mark.parametrize("v", list(VERSIONS))
def test_sglang_encodes_special_token_text_in_a_message_as_text(folder, hf, adapters, v) -> None:
    """The text is the same; recipe's ids spell the markup typed by a user in plain text."""
    family = VERSIONS[v].family
    body, kwargs = request(family, [user("Say <think> and <｜User｜>.")], None, True, None)
    text, ids = regen_render(folder, family, body, kwargs, "sglang")
    sglang_text, sglang_ids = sglang_recipe_prompt(body, adapters[v], hf)
    assert text == sglang_text and ids != sglang_ids


@pytest.mark.parametrize("v", list(VERSIONS))
def test_a_result_without_a_call_id_is_refused_by_sglang(folder, hf, adapters, v) -> None:
    family = VERSIONS[v].family
    messages = [user("Go"), assistant("", "r", [call("c1", "search", {"query": "x"})]),
                {"role": "tool", "content": "done"}]  # fmt: skip
    body, kwargs = request(family, messages, TOOLS, True, None)
    with pytest.raises(ValueError):
        sglang_recipe_prompt(body, adapters[v], hf)
    with pytest.raises(TemplateError):
        regen_render(folder, family, body, kwargs, "sglang")


def test_v41s_effort_is_a_budget_line(vllm_prompts) -> None:
    line = "<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: {} (range 1-100"
    for label, budget in (("thinking", 75), ("effort low", 50), ("effort max", 100)):
        prompt = vllm_prompts[("V4.1", f"one user turn / {label}")]["prompt"]
        assert prompt.startswith(line.format(budget)), label


@pytest.mark.parametrize(("v", "mode"), [("V4", "deepseek_v4"), ("V4.1", "deepseek_v41")])
def test_the_switches_and_the_effort(v: str, mode: str) -> None:
    family = VERSIONS[v].family
    assert family.template_kwargs(True) == {
        "thinking": True, "enable_thinking": True, "reasoning_effort": "high"}  # fmt: skip
    assert family.template_kwargs(False) == {"thinking": False, "enable_thinking": False}
    assert family.request_fields("max") == {"reasoning_effort": "max"}
    assert family.request_fields(False) == {}
    with pytest.raises(ValueError):
        family.template_kwargs("medium")
    assert family.aux_shift == "unsupported" and family.vllm_tokenizer_mode == mode
