"""DeepSeek-V4 against both engines' own code.

- The answer's text round trip: the text the model writes after its generation prompt →
  SGLang 0.5.23 (its deepseek-recipe adapter, ``deepseek-v4`` / ``deepseekv4``: recipe's
  token-level parser over the ids) or vLLM 0.32 (the ``deepseek_v4`` engine parser) →
  (reasoning, content, calls) → ``DEEPSEEK_V4.response_text`` → the same text, and the same ids.
- The prompt: regen's Renderer gives the text and ids each engine renders for the same
  request, thinking on (effort ``high``), off, ``low`` and ``max``: SGLang's adapter over
  deepseek-recipe in this process, vLLM's server renderer (``--tokenizer-mode deepseek_v4``) in
  the vLLM environment's worker (tests/_vllm_call.py); where the two part ways
  (:data:`_dsml.EDGES`) regen follows each.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _dsml import (
    CONVERSATIONS,
    EDGES,
    TOKENS,
    TOOLS,
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

EOS = "<｜end▁of▁sentence｜>"
ON = DEEPSEEK_V4.template_kwargs(True)
OFF = DEEPSEEK_V4.template_kwargs(False)
SPECIAL = [t for t, _ in TOKENS]
MODE = DEEPSEEK_V4.vllm_tokenizer_mode


def invoke(name: str, *params: tuple[str, str, str]) -> str:
    """A call as the model writes it; ``params``: (key, string flag, value)."""
    body = "\n".join(
        f'<｜DSML｜parameter name="{k}" string="{flag}">{v}</｜DSML｜parameter>'
        for k, flag, v in params
    )
    return f'<｜DSML｜invoke name="{name}">\n{body}\n</｜DSML｜invoke>'


def block(*invokes: str) -> str:
    return "<｜DSML｜tool_calls>\n" + "\n".join(invokes) + "\n</｜DSML｜tool_calls>"


W = invoke("get_weather", ("city", "true", "Zürich"), ("days", "false", "2"),
           ("options", "false", '{"units": "°C", "list": [1, 2.5, null, true]}'))  # fmt: skip
T = invoke("get_time", ("zone", "true", "CET"))
SPACED = invoke("get_time", ("zone", "true", " CET \n"))
COMPACT = invoke("get_time", ("zone", "false", "[1,2]"))
STRIPS = "SGLang (recipe) strips the newlines that open the reasoning and the answer"
CASES = {
    "reasoning and answer": Case(f"Need the weather.</think>It is sunny.{EOS}", "open", kwargs=ON),
    "newlines": Case(f"\nNeed it.\n</think>\n\nIt is sunny.\n{EOS}", "open", kwargs=ON,
                     sglang_differs=STRIPS,
                     vllm_differs="vLLM strips the whitespace that ends the reasoning"),
    "thinking off": Case(f"It is sunny.{EOS}", "closed", kwargs=OFF),
    "one call": Case(f"Need it.</think>\n\n{block(W)}{EOS}", "open", calls=1, kwargs=ON),
    "two calls": Case(f"Need both.</think>\n\n{block(W, T)}{EOS}", "open", calls=2, kwargs=ON),
    "content before a call": Case(f"Need it.</think>Let me check.\n\n{block(W)}{EOS}", "open",
                                  calls=1, kwargs=ON),
    "a call, thinking off": Case(f"Checking.\n\n{block(W)}{EOS}", "closed", calls=1, kwargs=OFF),
    "cut in the reasoning": Case("Need the wea", "open", finish="length", kwargs=ON),
    "cut in the answer": Case("Need it.</think>It is su", "open", finish="length", kwargs=ON),
    "spaces around a string value": Case(f"Need it.</think>\n\n{block(SPACED)}{EOS}", "open",
                                         calls=1, kwargs=ON),
    "a compact JSON value": Case(
        f"Need it.</think>\n\n{block(COMPACT)}{EOS}", "open", calls=1, kwargs=ON,
        sglang_differs="the value is re-dumped with spaces",
        vllm_differs="the value is re-dumped with spaces"),
    "no blank line before the calls": Case(
        f"Need it.</think>Let me check.{block(W)}{EOS}", "open", calls=1, kwargs=ON,
        sglang_differs="the rebuild writes the encoder's \\n\\n before the block",
        vllm_differs="the rebuild writes the encoder's \\n\\n before the block"),
}  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("dsv4") / "tok")


@pytest.fixture(scope="module")
def hf(folder):
    return AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def adapter(hf):
    return recipe_adapter("dsv4", hf)


# -- the answer -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CASES))
def test_sglang_round_trip(adapter, hf, name: str) -> None:
    case = CASES[name]
    rebuilt = recipe_round_trip(DEEPSEEK_V4, case, adapter, hf, PARSE_TOOLS)
    check(case, rebuilt, case.sglang_differs)


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, dict]:
    got = vllm_parse(DEEPSEEK_V4, list(CASES.values()), SPECIAL, composed=True)
    return dict(zip(CASES, got, strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_round_trip(vllm_results, name: str) -> None:
    case = CASES[name]
    check(case, vllm_round_trip(DEEPSEEK_V4, case, vllm_results[name]), case.vllm_differs)


def test_ids_of_the_rebuilt_text(adapter, hf) -> None:
    for name, case in CASES.items():
        if not case.sglang_differs:
            rebuilt = recipe_round_trip(DEEPSEEK_V4, case, adapter, hf, PARSE_TOOLS)
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
    **prompt_jobs(DEEPSEEK_V4, SETTINGS, CONVERSATIONS),
    **prompt_jobs(DEEPSEEK_V4, {"thinking": (True, None), "no thinking": (False, None)}, EDGES),
}
#: where the two engines' prompts differ, and what regen must follow in each
DIFFERENT = [
    "a developer message mid-conversation / thinking",
    "a later system message, tools / no thinking",
    "two answers in a row / no thinking",
    "history arguments that are not an object / thinking",
    "numbers in the arguments / no thinking",
    "thinking, vLLM's drop_thinking off",
]


@pytest.fixture(scope="module")
def vllm_prompts(folder) -> dict[str, dict]:
    jobs = [{"mode": MODE, "body": body} for body, _ in JOBS.values()]
    return dict(zip(JOBS, vllm_renders(folder, jobs), strict=True))


@pytest.mark.parametrize("name", list(JOBS))
def test_the_prompt_is_sglangs(folder, hf, adapter, name: str) -> None:
    body, kwargs = JOBS[name]
    text, ids = regen_render(folder, DEEPSEEK_V4, body, kwargs, "sglang")
    assert (text, ids) == sglang_recipe_prompt(body, adapter, hf)


@pytest.mark.parametrize("name", list(JOBS))
def test_the_prompt_is_vllms(folder, vllm_prompts, name: str) -> None:
    body, kwargs = JOBS[name]
    text, ids = regen_render(folder, DEEPSEEK_V4, body, kwargs, "vllm")
    assert (text, ids) == (vllm_prompts[name]["prompt"], vllm_prompts[name]["ids"])


@pytest.mark.parametrize("name", DIFFERENT)
def test_where_the_engines_part_ways(hf, adapter, vllm_prompts, name: str) -> None:
    if name in JOBS:
        assert sglang_recipe_prompt(JOBS[name][0], adapter, hf)[0] != vllm_prompts[name]["prompt"]
        return
    changed = [k for k in JOBS if k.endswith(f"/ {name}")]  # a vLLM-only kwarg
    assert any(vllm_prompts[k]["prompt"] != vllm_prompts[k.replace(name, "thinking")]["prompt"]
               for k in changed)  # fmt: skip


def test_plain_and_legacy_render_as_vllm(folder, vllm_prompts) -> None:
    name = "system, tools, calls, results, next user turn / effort max"
    body, kwargs = JOBS[name]
    for engine in ("plain", "legacy"):
        assert regen_render(folder, DEEPSEEK_V4, body, kwargs, engine)[0] == (
            vllm_prompts[name]["prompt"]), engine  # fmt: skip


def test_sglang_encodes_special_token_text_in_a_message_as_text(folder, hf, adapter) -> None:
    """The text is the same; recipe's ids spell the markup typed by a user in plain text."""
    body, kwargs = request(DEEPSEEK_V4, [user("Say <think> and <｜User｜>.")], None, True, None)
    text, ids = regen_render(folder, DEEPSEEK_V4, body, kwargs, "sglang")
    sglang_text, sglang_ids = sglang_recipe_prompt(body, adapter, hf)
    assert text == sglang_text and ids != sglang_ids


def test_a_result_without_a_call_id_is_refused_by_sglang(folder, hf, adapter) -> None:
    messages = [user("Go"), assistant("", "r", [call("c1", "search", {"query": "x"})]),
                {"role": "tool", "content": "done"}]  # fmt: skip
    body, kwargs = request(DEEPSEEK_V4, messages, TOOLS, True, None)
    with pytest.raises(ValueError):
        sglang_recipe_prompt(body, adapter, hf)
    with pytest.raises(TemplateError):
        regen_render(folder, DEEPSEEK_V4, body, kwargs, "sglang")


def test_the_switches_and_the_effort() -> None:
    assert ON == {"thinking": True, "enable_thinking": True, "reasoning_effort": "high"}
    assert OFF == {"thinking": False, "enable_thinking": False}
    assert DEEPSEEK_V4.request_fields("max") == {"reasoning_effort": "max"}
    assert DEEPSEEK_V4.request_fields(False) == {}
    with pytest.raises(ValueError):
        DEEPSEEK_V4.template_kwargs("medium")
    assert DEEPSEEK_V4.aux_shift == "unsupported" and MODE == "deepseek_v4"
