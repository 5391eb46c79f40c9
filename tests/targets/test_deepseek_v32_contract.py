"""DeepSeek-V3.2 against both engines' own code.

- The answer's text round trip: the text the model writes after its generation prompt →
  SGLang 0.5.23 (``deepseek-v3`` reasoning, ``deepseekv32`` tools) or vLLM 0.32 (the parser it
  composes from ``deepseek_v3`` and ``deepseek_v32``) → (reasoning, content, calls) →
  ``DEEPSEEK_V32.response_text`` → the same text, and the same ids through a tokenizer holding
  DeepSeek's special tokens.
- The prompt: regen's Renderer (the engine's preparation, then the family's encoder) gives the
  text and ids each engine renders for the same request: SGLang's dsv32 path
  (``encoding_dsv32``) in this process, vLLM's server renderer (``--tokenizer-mode
  deepseek_v32``) in the vLLM environment's worker (tests/_vllm_call.py); the engines disagree
  on a request with a system message and tools, and regen follows each.
- Recognition against V3.1, V4 and V4.1 tokenizers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _dsml import (
    CONVERSATIONS,
    SYSTEM,
    TOKENS,
    TOOLS,
    V32_MARKUP,
    assistant,
    build_tokenizer,
    call,
    prompt_jobs,
    recognised_by,
    recognition_cases,
    regen_render,
    request,
    result,
    sglang_v32_prompt,
    user,
    vllm_renders,
)
from _engines import Case, check, same_ids, sglang, sglang_round_trip, vllm_parse, vllm_round_trip
from transformers import AutoTokenizer

from regen.core.errors import TemplateError
from regen.targets.deepseek_v32 import DEEPSEEK_V32

EOS = "<｜end▁of▁sentence｜>"
ON = {"thinking": True, "enable_thinking": True}
OFF = {"thinking": False, "enable_thinking": False}


invoke, block = V32_MARKUP.invoke, V32_MARKUP.calls
W = invoke("get_weather", ("city", "true", "Zürich"), ("days", "false", "2"),
           ("options", "false", '{"units": "°C", "list": [1, 2.5, null, true]}'))  # fmt: skip
T = invoke("get_time", ("zone", "true", "CET"))
SPACED = invoke("get_time", ("zone", "true", " CET \n"))
COMPACT = invoke("get_time", ("zone", "false", "[1,2]"))

CASES = {
    "reasoning and answer": Case(f"Need the weather.</think>It is sunny.{EOS}", "open", kwargs=ON),
    "newlines kept": Case(f"\nNeed it.\n</think>\n\nIt is sunny.\n{EOS}", "open", kwargs=ON),
    "thinking off": Case(f"It is sunny.{EOS}", "closed", kwargs=OFF),
    "one call": Case(f"Need it.</think>\n\n{block(W)}{EOS}", "open", calls=1, kwargs=ON),
    "two calls": Case(f"Need both.</think>\n\n{block(W, T)}{EOS}", "open", calls=2, kwargs=ON),
    "content before a call": Case(f"Need it.</think>Let me check.\n\n{block(W)}{EOS}", "open",
                                  calls=1, kwargs=ON),
    "a call, thinking off": Case(f"Checking.\n\n{block(W)}{EOS}", "closed", calls=1, kwargs=OFF),
    "cut in the reasoning": Case("Need the wea", "open", finish="length", kwargs=ON),
    "cut in the answer": Case("Need it.</think>It is su", "open", finish="length", kwargs=ON),
    "spaces around a string value": Case(
        f"Need it.</think>\n\n{block(SPACED)}{EOS}", "open", calls=1, kwargs=ON,
        sglang_differs="SGLang strips string values (strip_string_param_value)"),
    "a compact JSON value": Case(
        f"Need it.</think>\n\n{block(COMPACT)}{EOS}", "open", calls=1, kwargs=ON,
        sglang_differs="the value is re-dumped with spaces",
        vllm_differs="the value is re-dumped with spaces"),
    "no blank line before the calls": Case(
        f"Need it.</think>Let me check.{block(W)}{EOS}", "open", calls=1, kwargs=ON,
        sglang_differs="the rebuild writes the encoder's \\n\\n before the block",
        vllm_differs="the rebuild writes the encoder's \\n\\n before the block"),
}  # fmt: skip
SPECIAL = [t for t, _ in TOKENS]


# -- the answer -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def detector():
    return sglang("function_call.deepseekv32_detector").DeepSeekV32Detector()


@pytest.mark.parametrize("name", list(CASES))
def test_sglang_round_trip(detector, name: str) -> None:
    case = CASES[name]
    check(case, sglang_round_trip(DEEPSEEK_V32, case, detector), case.sglang_differs)


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, dict]:
    got = vllm_parse(DEEPSEEK_V32, list(CASES.values()), SPECIAL, composed=True)
    return dict(zip(CASES, got, strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_round_trip(vllm_results, name: str) -> None:
    case = CASES[name]
    check(case, vllm_round_trip(DEEPSEEK_V32, case, vllm_results[name]), case.vllm_differs)


def test_ids_of_the_rebuilt_text(detector) -> None:
    for name, case in CASES.items():
        if not case.sglang_differs:
            rebuilt = sglang_round_trip(DEEPSEEK_V32, case, detector)
            assert same_ids(SPECIAL, case.text, rebuilt), name


# -- the prompt -------------------------------------------------------------------------------
SETTINGS = {"thinking": (True, None), "no thinking": (False, None)}
JOBS = prompt_jobs(DEEPSEEK_V32, SETTINGS, CONVERSATIONS)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("dsv32") / "tok")


@pytest.fixture(scope="module")
def hf(folder):
    return AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def vllm_prompts(folder) -> dict[str, dict]:
    """Every prompt job and refused request through vLLM, in one subprocess."""
    bodies = {**{k: b for k, (b, _) in JOBS.items()}, **{k: r[0] for k, r in refused().items()}}
    jobs = [{"mode": "deepseek_v32", "body": body} for body in bodies.values()]
    return dict(zip(bodies, vllm_renders(folder, jobs), strict=True))


@pytest.mark.parametrize("name", list(JOBS))
def test_the_prompt_is_sglangs(folder, hf, name: str) -> None:
    body, kwargs = JOBS[name]
    assert regen_render(folder, DEEPSEEK_V32, body, kwargs, "sglang") == sglang_v32_prompt(body, hf)


@pytest.mark.parametrize("name", list(JOBS))
def test_the_prompt_is_vllms(folder, vllm_prompts, name: str) -> None:
    body, kwargs = JOBS[name]
    text, ids = regen_render(folder, DEEPSEEK_V32, body, kwargs, "vllm")
    assert (text, ids) == (vllm_prompts[name]["prompt"], vllm_prompts[name]["ids"])


def test_plain_and_legacy_render_as_vllm(folder, vllm_prompts) -> None:
    name = "system, tools, calls, results, next user turn / thinking"
    body, kwargs = JOBS[name]
    for engine in ("plain", "legacy"):
        text, _ = regen_render(folder, DEEPSEEK_V32, body, kwargs, engine)
        assert text == vllm_prompts[name]["prompt"], engine


def test_the_engines_order_a_system_message_and_tools_differently(vllm_prompts) -> None:
    """vLLM puts the tools before the system text (a new system message), SGLang after it."""
    body, _ = JOBS["system, tools, calls, results, next user turn / no thinking"]
    sglang_text = DEEPSEEK_V32.encode_prompt(body["messages"], TOOLS, body["chat_template_kwargs"],
                                             "sglang")  # fmt: skip
    vllm_text = vllm_prompts["system, tools, calls, results, next user turn / no thinking"]
    system = SYSTEM["content"]
    assert sglang_text.startswith(f"<｜begin▁of▁sentence｜>{system}\n\n## Tools")
    assert vllm_text["prompt"].startswith("<｜begin▁of▁sentence｜>\n\n## Tools")
    assert f"</functions>\n{system}<｜User｜>" in vllm_text["prompt"]


REFUSED = {
    "a developer message before the last user turn (thinking)": (
        [user("Hi"), assistant("Hello", "r"), {"role": "developer", "content": "Be brief."},
         user("More")], None, "both"),
    "an answer without reasoning after the last user turn (thinking)": (
        [user("Hi"), assistant("Hello"), {"role": "system", "content": "Be brief."}], None,
        "both"),
    "a trailing answer without reasoning (thinking; SGLang re-sends it as a user turn)": (
        [user("Go"), assistant("", "r", [call("c1", "search", {"query": "x"})]),
         result("c1", "done"), assistant("Done.")], TOOLS, "vllm"),
    "history arguments that are not a JSON object (vLLM renders {})": (
        [user("Go"), assistant("", "r", [call("c1", "search", "[1, 2]")]), result("c1", "x")],
        TOOLS, "sglang"),
}  # fmt: skip


def refused() -> dict[str, tuple[dict, dict, str]]:
    """Each refused request (thinking on), the kwargs of regen's render, and who refuses."""
    out = {}
    for name, (messages, tools, who) in REFUSED.items():
        body, kwargs = request(DEEPSEEK_V32, messages, tools, True, None)
        out[name] = (body, kwargs, who)
    return out


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_the_engines_refuse_regen_refuses(folder, hf, vllm_prompts, name: str) -> None:
    body, kwargs, who = refused()[name]
    if who in ("both", "sglang"):
        with pytest.raises(Exception):  # noqa: B017 (ValueError, DS32EncodingError: a 400)
            sglang_v32_prompt(body, hf)
        with pytest.raises(TemplateError):
            regen_render(folder, DEEPSEEK_V32, body, kwargs, "sglang")
    else:
        assert regen_render(folder, DEEPSEEK_V32, body, kwargs, "sglang") == sglang_v32_prompt(
            body, hf)  # fmt: skip
    vllm = vllm_prompts[name]
    if who in ("both", "vllm"):
        assert "error" in vllm
        with pytest.raises(TemplateError):
            regen_render(folder, DEEPSEEK_V32, body, kwargs, "vllm")
    else:
        assert regen_render(folder, DEEPSEEK_V32, body, kwargs, "vllm")[0] == vllm["prompt"]


def test_the_switch_is_sent_both_ways() -> None:
    assert DEEPSEEK_V32.template_kwargs(True) == ON
    assert DEEPSEEK_V32.template_kwargs(False) == OFF
    assert DEEPSEEK_V32.request_fields(True) == {}
    assert DEEPSEEK_V32.think_state(f"x{'<｜Assistant｜>'}<think>") == "open"
    assert DEEPSEEK_V32.think_state("</function_results>\n\n</think>") == "closed"
    assert len(CONVERSATIONS) * len(SETTINGS) == len(JOBS)


# -- recognition ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(recognition_cases()))
def test_recognition(name: str) -> None:
    facts, expected = recognition_cases()[name]
    assert recognised_by(facts) == expected
