"""regen's local render hands every family's template what the serving engine hands it.

Per family with a Jinja template (its tiny tokenizer, tests/_families.py; DeepSeek-V3.1 with
the template its demo target is served with, ``target.chat_template``) and per conversation
with tool-call history (the demo's SWE-Gym, Glaive and xLAM samples, and one written here with
reasoning, compact and non-ASCII arguments, a tool without a description and Python-style
parameter types), thinking on and off: ``Renderer.render_prompt(..., engine)`` equals the
prompt that engine renders, as its own code prepares the request (tests/contract/_served.py):

- vLLM 0.32: the request through its protocol model and ``parse_chat_messages`` (content format
  by its own AST check), then the template, in its environment's worker (tests/_vllm_call.py);
- SGLang 0.5.23: the request through its protocol models and ``serving_chat.py``'s argument
  and content normalisation, from the wheel, then the template.

History arguments that are no JSON object: vLLM renders ``{}``, SGLang refuses the request
(ArgumentsError here, its 400 there). GPT-OSS is compared on SGLang only: vLLM renders a gpt_oss
model's prompts with harmony, not the template (tests/targets/test_gpt_oss_contract.py).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from _families import REPO, family_tokenizer, has_template

from regen.core.errors import ArgumentsError, TemplateError
from regen.core.sample import Message, ToolCall
from regen.manifest import load_manifest
from regen.sources import read_samples, source_set
from regen.targets import FAMILIES, Family
from regen.template.prepare import loops_over_content
from regen.template.render import Renderer
from regen.template.tokenizer import load_tokenizer

sys.path.insert(0, str(REPO / "tests" / "contract"))
from _served import sglang_inputs, vllm_prompts

#: families whose prompts vLLM renders otherwise than with the template (their own tests)
NOT_JINJA_ON_VLLM = {"gpt_oss": "vLLM renders a gpt_oss model's prompt with harmony"}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "n": {"type": "number"}}}}},
    {"type": "function", "function": {"parameters": {"type": "object", "properties": {
        "q": {"type": "str, optional"}, "k": {"type": "int"}}}, "name": "search"}},
]  # fmt: skip
WRITTEN = [
    Message("system", "You are terse."),
    Message("user", "Weather in Zürich, and search 'föhn'?"),
    Message("assistant", "Let me look.", reasoning="Two lookups.", tool_calls=(
        ToolCall("call_0", "get_weather", '{"city":"Zürich","n":1.50}'),
        ToolCall("call_1", "search", '{"q": "föhn", "k": {"deep": [1, 2]}}'),
    )),
    Message("tool", "12 C", tool_call_id="call_0", name="get_weather"),
    Message("tool", "Föhn is a wind.", tool_call_id="call_1", name="search"),
    Message("assistant", "12 C; föhn is a wind.", reasoning="Both came back."),
    Message("user", "And tomorrow?"),
]  # fmt: skip
BAD = {"not json": "{city: Oslo}", "a list": "[1, 2]", "empty": ""}


def jinja_families() -> list[str]:
    return sorted(n for n, f in FAMILIES.items() if not f.encodes_prompts and has_template(f))


def demo_conversations() -> list[tuple[list[Message], list[dict[str, Any]] | None]]:
    """The request of each demo sample's last turn whose history holds a tool call."""
    manifest = load_manifest(REPO / "manifests" / "demo.yaml")
    out: list[tuple[list[Message], Any]] = []
    for s in read_samples(source_set(manifest)):
        if s.mode != "regenerate":
            continue
        last = max((i for i, m in enumerate(s.messages) if m.role == "assistant"), default=-1)
        history = s.messages[:last]
        if any(m.tool_calls for m in history):
            out.append((history, s.tools))
    return out


@pytest.fixture(scope="module")
def conversations() -> list[tuple[list[Message], Any]]:
    demo = demo_conversations()
    assert len(demo) >= 5 and all(any(m.tool_calls for m in msgs) for msgs, _ in demo)
    return [(WRITTEN, TOOLS), *demo]


@pytest.fixture(scope="module")
def renderers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Renderer]:
    tmp = tmp_path_factory.mktemp("tokenizers")
    out = {}
    for name in jinja_families():
        fam = FAMILIES[name]
        served = None
        if name == "deepseek_v3":
            served = load_manifest(REPO / "manifests" / "demo-deepseek.yaml").served_template()
        out[name] = Renderer(load_tokenizer(family_tokenizer(fam, tmp)), family=fam,
                             chat_template=served)  # fmt: skip
    return out


def body(messages: list[Message], tools: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The request regen sends for these messages (the OpenAI wire form)."""
    req: dict[str, Any] = {"model": "m", "messages": [m.to_openai() for m in messages]}
    if tools:
        req["tools"] = tools
    if kwargs:
        req["chat_template_kwargs"] = kwargs
    return req


def regen_prompt(r: Renderer, messages: list[Message], tools: Any, engine: str) -> str | None:
    """regen's render for ``engine`` (None: the template refuses this conversation)."""
    try:
        return r.render_prompt(messages, tools, engine)
    except ArgumentsError:
        raise
    except TemplateError:
        return None


def with_bad_arguments(text: str) -> list[Message]:
    m = WRITTEN[2]
    call = ToolCall("call_0", "get_weather", text)
    return [*WRITTEN[:2], Message("assistant", m.content, m.reasoning, (call,)),
            WRITTEN[3], WRITTEN[5], WRITTEN[6]]  # fmt: skip


def thinking_kwargs(fam: Family) -> list[dict[str, Any]]:
    return [fam.template_kwargs(True), fam.template_kwargs(False)]


@pytest.fixture(scope="module")
def vllm_rendered(
    renderers: dict[str, Renderer], conversations: list[Any], tmp_path_factory: Any
) -> dict[tuple[str, int, int], dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("vllm-tokenizers")
    jobs, keys = [], []
    for name, r in renderers.items():
        if name in NOT_JINJA_ON_VLLM:
            continue
        folder = str(family_tokenizer(r.family, tmp))
        for i, (msgs, tools) in enumerate([*conversations, *((with_bad_arguments(t), TOOLS)
                                                             for t in BAD.values())]):  # fmt: skip
            for k, kwargs in enumerate(thinking_kwargs(r.family)):
                jobs.append({"tokenizer": folder, "template": r.chat_template,
                             "body": body(msgs, tools, kwargs), "kwargs": kwargs})  # fmt: skip
                keys.append((name, i, k))
    return dict(zip(keys, vllm_prompts(jobs), strict=True))


@pytest.mark.parametrize("name", jinja_families())
def test_vllm_renders_what_regen_renders(
    name: str, renderers: dict[str, Renderer], conversations: list[Any], vllm_rendered: Any
) -> None:
    if name in NOT_JINJA_ON_VLLM:
        pytest.skip(NOT_JINJA_ON_VLLM[name])
    r = renderers[name]
    cases = [*conversations, *((with_bad_arguments(t), TOOLS) for t in BAD.values())]
    rendered = 0
    for i, (msgs, tools) in enumerate(cases):
        for k, kwargs in enumerate(thinking_kwargs(r.family)):
            got = vllm_rendered[(name, i, k)]
            # regen's AST check of the template finds vLLM's content format
            assert got["format"] == ("openai" if loops_over_content(r.chat_template) else "string")
            r.template_kwargs = kwargs
            mine = regen_prompt(r, msgs, tools, "vllm")
            if "error" in got:
                assert mine is None, (i, k, got["error"])
                continue
            assert mine == got["prompt"], (i, k)
            rendered += 1
    assert rendered >= len(cases)  # most conversations render on every template


@pytest.mark.parametrize("name", jinja_families())
def test_sglang_renders_what_regen_renders(
    name: str, renderers: dict[str, Renderer], conversations: list[Any]
) -> None:
    r = renderers[name]
    tok = r.tokenizer
    rendered = 0
    for i, (msgs, tools) in enumerate(conversations):
        for kwargs in thinking_kwargs(r.family):
            messages, served_tools = sglang_inputs(body(msgs, tools, kwargs), r.chat_template)
            try:
                theirs = tok.apply_chat_template(messages, tools=served_tools,
                                                 chat_template=r.chat_template,
                                                 add_generation_prompt=True, tokenize=False,
                                                 **kwargs)  # fmt: skip
            except Exception:  # SGLang answers 400 where the template raises
                theirs = None
            r.template_kwargs = kwargs
            assert regen_prompt(r, msgs, tools, "sglang") == theirs, (i, kwargs)
            rendered += theirs is not None
    assert rendered >= len(conversations)


@pytest.mark.parametrize("bad", list(BAD))
def test_arguments_that_are_no_object_render_as_each_engine_does(
    bad: str, renderers: dict[str, Renderer]
) -> None:
    """vLLM renders ``{}`` (the compared renders above include these conversations); SGLang
    refuses the request, and so does regen's SGLang render: the sample fails, not the run."""
    msgs = with_bad_arguments(BAD[bad])
    r = renderers["qwen3"]
    with pytest.raises(ValueError, match=r"function\.arguments must be"):
        sglang_inputs(body(msgs, TOOLS, {}), r.chat_template)
    with pytest.raises(ArgumentsError, match=r"function\.arguments must be"):
        r.render_prompt(msgs, TOOLS, "sglang")
    assert '"arguments": {}' in r.render_prompt(msgs, TOOLS, "vllm")
    assert '"arguments": {}' in r.render_prompt(msgs, TOOLS)  # no engine known: never refused


def test_a_run_started_before_renders_arguments_as_strings(renderers: dict[str, Renderer]) -> None:
    """run.json's ``render: strings`` (a run.json of before): the request's JSON text reaches
    the template, as regen rendered then."""
    tok = renderers["qwen3"].tokenizer
    old = Renderer(tok, family=FAMILIES["qwen3"], arguments="strings")
    prompt = old.render_prompt(WRITTEN, TOOLS, "vllm")
    assert '{"city":"Zürich","n":1.50}' in prompt  # verbatim: the string went through
    new = renderers["qwen3"].render_prompt(WRITTEN, TOOLS, "vllm")
    assert '{"city": "Zürich", "n": 1.5}' in new  # the object, written back by tojson
