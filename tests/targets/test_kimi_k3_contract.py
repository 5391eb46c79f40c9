"""Kimi K3 against both engines' own code.

- **The prompt.** regen's ``Renderer(..., family=KIMI_K3).render_prompt(messages, tools,
  engine)`` (its own port of K3's encoder, over a tiny tokenizer holding K3's special tokens and
  no chat template) equals what each engine hands K3's tokenizer, rendered by the witness: the
  vendored llama.cpp port of the encoder (templates/kimi_k3.jinja) through transformers'
  ``apply_chat_template``, behind a stand-in with the tokenizer's defaults (_k3_stand.py):

  - vLLM 0.32 in its environment's worker process (_vllm_k3_render.py): its request validation,
    tool dump, chat params and ``KimiK3Renderer.render_messages`` itself;
  - SGLang 0.5.23 in process: its request model, schema-type rewrite, lenient argument parse,
    and ``OpenAIServingChat._prepare_kimi_k3_messages`` / ``_encode_messages`` /
    ``_effective_tools`` compiled from serving_chat.py's own source (the module imports the
    whole server).

  The Jinja port differs from the Python encoder where the engines never reach it or where these
  conversations avoid it: its ``dictsort`` is case-insensitive (tool schema keys that differ in
  case only: none here, :func:`test_the_port_is_case_insensitive_where_the_encoder_is_not`) and it
  renders string arguments as a ``json`` block where the encoder parses a JSON object (both
  engines parse those first: what reaches it is an object, or text that holds no JSON).
- **The answer.** The text the model writes → SGLang's ``kimi_k3`` reasoning parser and
  detector (in process; the text trimmed at ``<|close|>tools<|sep|>``, SGLang's stop string for
  K3 requests with tools) or vLLM's composed ``KimiK3Parser`` (the vLLM worker) → ``response_text``
  → the same text, and the same ids.
- **Recognition**: K3's tokens and model type against K2.6's.
"""

from __future__ import annotations
import __future__

import copy
import functools
import importlib.util
import json
import logging
import string
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _engines import (
    HERE,
    VLLM_TIMEOUT_S,
    Case,
    check,
    rebuild,
    same_ids,
    sglang,
    sglang_parse,
    strip_end,
    vllm_calls,
    vllm_parse,
)
from _k3_stand import K3Tokenizer
from _served import _serving_chat
from _vllm_call import vllm_call
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from regen.core.errors import TemplateError
from regen.core.sample import ToolCall
from regen.devkit.tokenizers.tiny import TEMPLATES_DIR
from regen.targets import FAMILIES, read_facts
from regen.targets import kimi as k2
from regen.targets.family import TokenizerFacts
from regen.targets.kimi_k3 import KIMI_K3, PUBLISHED_IDS, SPECIAL_TOKENS, VOCAB_SIZE, KimiK3Family
from regen.targets.kimi_k3_xtml import (
    CLOSE,
    END_OF_MSG,
    MESSAGE_END,
    OPEN,
    RESPONSE_CLOSE,
    RESPONSE_OPEN,
    SEP,
    THINK_CLOSE,
    THINK_OPEN,
    TOOLS_CLOSE,
    TOOLS_OPEN,
)
from regen.template.render import Renderer

TEMPLATE = TEMPLATES_DIR / "kimi_k3.jinja"
#: the tiny tokenizer's K3 tokens in the real id order (163584...), with ``special`` flags as
#: third-party copies of the tokenizer_config.json give them
K3_TOKENS = (
    ("[BOS]", True), ("[EOS]", True), (END_OF_MSG, True), (OPEN, False), (CLOSE, False),
    (SEP, False), ("[EOT]", True), ("<|media_pad|>", True), ("[PAD]", True),
)  # fmt: skip

# -- the conversations --------------------------------------------------------------------------
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "object"}},
        "required": ["city"]}}}  # fmt: skip
#: no description (vLLM declares "description": null, SGLang leaves it out), an ``int`` type
#: (SGLang rewrites it to integer) and strict
CLOCK = {"type": "function", "function": {
    "name": "get_time", "strict": True,
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"},
                                                    "offset": {"type": "int"}}}}}  # fmt: skip
K3_TOOLS = [WEATHER, CLOCK]


def call(cid: str, name: str, args: Any) -> dict[str, Any]:
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": text}}


def result(cid: str | None, text: str) -> dict[str, Any]:
    return {"role": "tool", "content": text, **({"tool_call_id": cid} if cid else {})}


PARIS = {"city": "Paris", "days": 2, "units": {"temp": "C"}, "hourly": False}
CET = {"zone": "CET", "offset": 1, "utc": True, "fields": ["hour", "minute"]}
CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "parallel calls, results out of order": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather in Paris, and the time there?"},
        {"role": "assistant", "reasoning_content": "Two lookups.", "content": "Let me check.",
         "tool_calls": [call("call_1", "get_weather", PARIS), call("call_2", "get_time", CET)]},
        result("call_2", "14:05"),
        result("call_1", "Paris: 18C"),
        {"role": "assistant", "reasoning_content": "Both back.", "content": "18C, 14:05."},
        {"role": "user", "content": "Thanks! And Zürich?"},
    ],
    "several turns, reasoning kept, blank and none": [
        {"role": "system", "content": "Be brief.", "name": "policy"},
        {"role": "user", "content": "Hi!", "name": "ana"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "reasoning_content": "  \n", "content": "4."},
        {"role": "user", "content": "And 3*3?"},
        {"role": "assistant", "reasoning_content": "Nine.\n", "content": " 9 ", "name": "bot"},
        {"role": "user", "content": "Thanks."},
    ],
    "results named by vLLM's name:position aliases": [
        {"role": "user", "content": "Weather and time?"},
        {"role": "assistant", "content": "", "tool_calls": [
            call("a", "get_weather", {"city": "Oslo"}), call("b", "get_time", {"zone": "CET"})]},
        result("get_time:1", "09:00"),
        result("get_weather:0", "Oslo: 3C"),
        {"role": "user", "content": "And now?"},
    ],
    "results it cannot place": [
        {"role": "user", "content": "Weather and time?"},
        {"role": "assistant", "content": "On it.", "tool_calls": [
            call("a", "get_weather", {"city": "Oslo"}), call("b", "get_time", {"zone": "CET"})]},
        result("x", "Oslo: 3C"),
        result("y", "09:00"),
        {"role": "user", "content": "Go on."},
    ],
    "arguments that are text": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "reasoning_content": "Broken call.", "content": None,
         "tool_calls": [call("a", "get_weather", "city=Oslo"), call("b", "get_time", "")]},
        result("a", "error"),
        result("b", "09:00"),
        {"role": "user", "content": "Retry."},
    ],
    "escapes and non-ASCII": [
        {"role": "user", "content": 'Quote "this" & <that>; café'},
        {"role": "assistant", "content": "Sure.", "tool_calls": [
            call("q", "get_weather", {'a"b&c': "x<y> é", "n": 1.5, "none": None})]},
        result("q", "ok ☃"),
        {"role": "user", "content": "Placeholder <|kimi_image_placeholder|> typed."},
    ],
    "a developer message and tools declared by a system message": [
        {"role": "developer", "content": "Answer in French."},
        {"role": "system", "content": "", "tools": [copy.deepcopy(CLOCK)]},
        {"role": "user", "content": "Heure?"},
    ],
}  # fmt: skip
#: chat_template_kwargs: regen's own (each effort, thinking off), the defaults, none effort
KWARGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    **{f"effort {e}": KIMI_K3.template_kwargs(e) for e in KIMI_K3.efforts},
    "thinking on": KIMI_K3.template_kwargs(True),
    "thinking off": KIMI_K3.template_kwargs(False),
    "effort none": {"thinking": True, "thinking_effort": None},
}
#: kwargs the engines read differently (vLLM maps enable_thinking and reasoning_effort)
ENGINE_KWARGS: dict[str, dict[str, Any]] = {
    "enable_thinking off": {"enable_thinking": False},
    "reasoning_effort low": {"reasoning_effort": "low"},
    "reasoning_effort none": {"reasoning_effort": "none"},
}
PROMPTS = [(c, k) for c in CONVERSATIONS for k in (*KWARGS, *ENGINE_KWARGS)]


def body(conv: str, kw: str) -> dict[str, Any]:
    kwargs = {**KWARGS, **ENGINE_KWARGS}[kw]
    return {"model": "k3", "messages": copy.deepcopy(CONVERSATIONS[conv]),
            "tools": copy.deepcopy(K3_TOOLS), "chat_template_kwargs": kwargs}  # fmt: skip


# -- the tiny tokenizer and regen's renderer ----------------------------------------------------
def all_text() -> str:
    return json.dumps([CONVERSATIONS, K3_TOOLS, CASES_TEXT], ensure_ascii=False)


def build_k3_tokenizer(folder: Path, text: str) -> PreTrainedTokenizerFast:
    """A one-character-per-token WordLevel tokenizer with K3's tokens added after its
    characters, in their real order; no chat template (K3 ships none)."""
    chars = sorted(set(string.printable) | set(text))
    tk = Tokenizer(models.WordLevel({"[UNK]": 0, **{c: i + 1 for i, c in enumerate(chars)}},
                                    unk_token="[UNK]"))  # fmt: skip
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    tk.decoder = decoders.Fuse()
    tk.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in K3_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="[BOS]", eos_token=END_OF_MSG,
                                   pad_token="[PAD]", unk_token="[UNK]")  # fmt: skip
    fast.save_pretrained(folder)
    return fast


@pytest.fixture(scope="module")
def k3_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("k3-tokenizer")
    build_k3_tokenizer(folder, all_text())
    return folder


@pytest.fixture(scope="module")
def tokenizer(k3_folder):
    return AutoTokenizer.from_pretrained(k3_folder)


def regen_prompt(tokenizer, conv: str, kw: str, engine: str) -> str:
    b = body(conv, kw)
    renderer = Renderer(tokenizer, b["chat_template_kwargs"], family=KIMI_K3)
    return renderer.render_prompt(b["messages"], b["tools"], engine)


def regen_or_error(tokenizer, conv: str, kw: str, engine: str) -> str:
    try:
        return regen_prompt(tokenizer, conv, kw, engine)
    except TemplateError as e:
        return f"error: {e}"


# -- SGLang's K3 prompt path, in process --------------------------------------------------------
_METHODS = ("_prepare_kimi_k3_messages", "_encode_messages", "_effective_tools")
_MODULE_NAMES = ("KIMI_K3_IMAGE_PLACEHOLDER", "KIMI_K3_IMAGE_PLACEHOLDER_ESCAPED",
                 "neutralize_kimi_k3_image_placeholder",
                 "neutralize_kimi_k3_image_placeholder_value")  # fmt: skip


@functools.cache
def sglang_serving() -> type:
    """A class holding ``OpenAIServingChat``'s K3 methods, compiled from serving_chat.py's own
    source with the module-level names they use."""
    import _sglang  # on the path _engines sets

    names = (*_MODULE_NAMES, *(f"OpenAIServingChat.{m}" for m in _METHODS))
    protocol = sglang("entrypoints.openai.protocol")
    ns: dict[str, Any] = {"Any": Any, "logger": logging.getLogger("sglang.k3"),
                          "ChatCompletionMessageGenericParam":
                              protocol.ChatCompletionMessageGenericParam}  # fmt: skip
    _sglang.wheel_exec("srt/entrypoints/openai/serving_chat.py", names, ns,
                       flags=__future__.annotations.compiler_flag)  # fmt: skip
    return type("K3Serving", (), {name: ns[name] for name in _METHODS})


def sglang_prompt(hf, b: dict[str, Any]) -> str:
    """``_apply_jinja_template``'s K3 path for the request ``b``: the text its tokenizer call
    renders; ``error: ...`` where SGLang refuses it."""
    protocol = sglang("entrypoints.openai.protocol")
    schema = sglang("function_call.utils")
    serving = sglang_serving()()
    stand = K3Tokenizer(hf, TEMPLATE.read_text(encoding="utf-8"))
    serving._encoding_adapter = None
    serving.chat_encoding_spec = "kimi_k3"
    serving.tokenizer_manager = SimpleNamespace(tokenizer=stand)
    try:
        request = protocol.ChatCompletionRequest.model_validate(copy.deepcopy(b))
        for tool in serving._effective_tools(request):  # _validate_request
            if tool.function.parameters is not None:
                schema.normalize_json_schema_types(tool.function.parameters)
        messages = [m.model_dump() for m in request.messages]
        for m in messages:
            _serving_chat()["normalize_assistant_tool_call_arguments"](m, strict=False)
        serving._encode_messages(copy.deepcopy(messages), request, None, tools=None,
                                 image_data=[])  # fmt: skip
    except Exception as e:  # SGLang answers these with an error
        return f"error: {type(e).__name__}: {e}"
    assert stand.rendered is not None
    return stand.rendered


@pytest.mark.parametrize(("conv", "kw"), PROMPTS)
def test_sglang_prompt(tokenizer, conv: str, kw: str) -> None:
    expected = sglang_prompt(tokenizer, body(conv, kw))
    assert not expected.startswith("error"), expected
    assert regen_prompt(tokenizer, conv, kw, "sglang") == expected


# -- vLLM's K3 prompt path, in the vLLM worker --------------------------------------------------
@pytest.fixture(scope="module")
def vllm_prompts(k3_folder) -> dict[tuple[str, str], dict]:
    jobs = [*PROMPTS, ("parallel calls, results out of order", "medium")]
    job = {"tokenizer": str(k3_folder), "template": str(TEMPLATE),
           "bodies": [vllm_body(c, k) for c, k in jobs]}  # fmt: skip
    out = vllm_call(HERE / "_vllm_k3_render.py", job, timeout_s=VLLM_TIMEOUT_S)
    return dict(zip(jobs, out, strict=True))


def vllm_body(conv: str, kw: str) -> dict[str, Any]:
    if kw == "medium":
        return {**body(conv, "defaults"), "chat_template_kwargs": {"thinking_effort": "medium"}}
    return body(conv, kw)


@pytest.mark.parametrize(("conv", "kw"), PROMPTS)
def test_vllm_prompt(vllm_prompts, tokenizer, conv: str, kw: str) -> None:
    got = vllm_prompts[(conv, kw)]
    assert "error" not in got, got
    assert regen_prompt(tokenizer, conv, kw, "vllm") == got["prompt"]


def test_vllm_refuses_an_effort_k3_does_not_take(vllm_prompts, tokenizer) -> None:
    got = vllm_prompts[("parallel calls, results out of order", "medium")]
    assert "thinking_effort" in got["error"]
    for engine in ("vllm", "sglang", "plain"):
        renderer = Renderer(tokenizer, {"thinking_effort": "medium"}, family=KIMI_K3)
        with pytest.raises(TemplateError, match="thinking_effort"):
            renderer.render_prompt(CONVERSATIONS["escapes and non-ASCII"], K3_TOOLS, engine)
    with pytest.raises(ValueError, match="medium"):
        KIMI_K3.template_kwargs("medium")


def test_regen_sends_what_both_engines_hand_the_encoder(vllm_prompts) -> None:
    """The kwargs regen sends reach K3's tokenizer unchanged on vLLM (the thinking switch and
    the effort level, nothing else that is a template variable)."""
    conv = "parallel calls, results out of order"
    for kw in ("effort max", "effort low", "effort high", "thinking off"):
        reached = vllm_prompts[(conv, kw)]["kwargs"]
        sent = KWARGS[kw]
        assert {k: reached[k] for k in sent} == sent
    assert vllm_prompts[(conv, "thinking off")]["kwargs"]["thinking"] is False


def test_the_engines_differ_where_their_preparations_do(tokenizer) -> None:
    """Each engine's render is witnessed above; here, what tells them apart."""

    def both(conv: str, kw: str = "effort max") -> tuple[str, str]:
        return regen_prompt(tokenizer, conv, kw, "vllm"), regen_prompt(tokenizer, conv, kw,
                                                                       "sglang")  # fmt: skip

    vllm, sgl = both("escapes and non-ASCII")
    assert '"description":null,"name":"get_time"' in vllm
    assert '"name":"get_time","parameters"' in sgl and '"description":null' not in sgl
    assert '"offset":{"type":"int"}' in vllm and '"offset":{"type":"integer"}' in sgl
    assert "<|kimi_image_placeholder|> typed" in vllm
    assert "<| kimi_image_placeholder |> typed" in sgl
    vllm, sgl = both("results named by vLLM's name:position aliases")
    tool = '<|open|>message role="tool" tool="{}" index="{}"<|sep|>{}'
    assert vllm.index(tool.format("get_weather", 1, "Oslo")) < vllm.index(
        tool.format("get_time", 2, "09:00"))  # fmt: skip
    assert tool.format("get_weather", 1, "09:00") in sgl  # named by position
    vllm, sgl = both("arguments that are text")
    assert f'<|open|>call tool="get_weather" index="1"<|sep|>{CLOSE}call' in vllm  # {}
    assert '<|open|>json type="object"<|sep|>city=Oslo<|close|>json<|sep|>' in sgl
    vllm, sgl = both("results it cannot place", "enable_thinking off")
    assert vllm.endswith(RESPONSE_OPEN) and sgl.endswith(THINK_OPEN)
    vllm, sgl = both("a developer message and tools declared by a system message")
    assert "Answer in French." not in vllm and "New Tools Available" not in vllm
    assert '<|open|>message role="system"<|sep|>Answer in French.' in sgl
    assert "New Tools Available" in sgl
    vllm, sgl = both("results it cannot place", "effort none")  # vLLM drops a None kwarg
    assert "`thinking_effort=max`" in vllm and "thinking-effort" not in sgl


def test_plain_and_legacy_render_as_vllm(tokenizer) -> None:
    for conv in CONVERSATIONS:
        vllm = regen_prompt(tokenizer, conv, "effort low", "vllm")
        assert regen_prompt(tokenizer, conv, "effort low", "plain") == vllm
        legacy = Renderer(tokenizer, KWARGS["effort low"], family=KIMI_K3, arguments="strings")
        b = body(conv, "effort low")
        if conv != "arguments that are text":  # the text holds no JSON: a json block, not {}
            assert legacy.render_prompt(b["messages"], b["tools"], "vllm") == vllm


def test_the_prompt_tail_and_state(tokenizer) -> None:
    conv = "several turns, reasoning kept, blank and none"
    for kw in ("defaults", "effort max", "effort low", "effort high", "effort none"):
        text = regen_prompt(tokenizer, conv, kw, "vllm")
        assert text.endswith(f'<|open|>message role="assistant"<|sep|>{THINK_OPEN}')
        assert KIMI_K3.think_state(text) == "open"
        effort = KWARGS[kw].get("thinking_effort", "max")
        assert (f"`thinking_effort={effort}`" in text) == (effort is not None)
    text = regen_prompt(tokenizer, conv, "thinking off", "sglang")
    assert text.endswith(RESPONSE_OPEN) and KIMI_K3.think_state(text) == "closed"
    assert THINK_OPEN not in text and "thinking-effort" not in text
    assert KIMI_K3.think_state('<|open|>message role="user"<|sep|>hi') == "none"


# -- ids: the engines encode segment by segment -------------------------------------------------
def segment_ids(tk: Tokenizer, family: KimiK3Family, b: dict[str, Any], engine: str) -> list:
    """The ids K3's tokenizer gives the prompt: control segments with their special tokens,
    every other segment as plain text (here one id per character)."""
    from regen.template.prepare import preparation

    prep = preparation(engine)
    msgs = prep.messages(b["messages"], "string", "keep" if engine == "sglang" else None)
    segments = family.prompt_segments(msgs, prep.tools(b["tools"]), b["chat_template_kwargs"],
                                      engine)  # fmt: skip
    ids: list[int] = []
    for s in segments:
        ids += tk.encode(s.text).ids if s.control else [tk.token_to_id(c) for c in s.text]
    return ids


def test_segments_give_the_engines_ids_and_a_whole_encode_only_without_markers(
    tokenizer, k3_folder
) -> None:
    tk = Tokenizer.from_file(str(k3_folder / "tokenizer.json"))
    for conv in CONVERSATIONS:
        for engine in ("vllm", "sglang"):
            b = body(conv, "effort max")
            text = regen_prompt(tokenizer, conv, "effort max", engine)
            renderer = Renderer(tokenizer, b["chat_template_kwargs"], family=KIMI_K3)
            assert renderer.encode(text) == segment_ids(tk, KIMI_K3, b, engine), (conv, engine)
    # text holding a marker string: the engines encode it as text, a whole encode as the token
    b = body("several turns, reasoning kept, blank and none", "effort max")
    b["messages"][1]["content"] = f"Say {END_OF_MSG} please"
    renderer = Renderer(tokenizer, b["chat_template_kwargs"], family=KIMI_K3)
    text = renderer.render_prompt(b["messages"], b["tools"], "vllm")
    whole, parts = renderer.encode(text), segment_ids(tk, KIMI_K3, b, "vllm")
    assert whole != parts and len(parts) == len(whole) + len(END_OF_MSG) - 1
    assert renderer.decode(whole) == renderer.decode(parts) == text


def test_the_port_is_case_insensitive_where_the_encoder_is_not(tokenizer) -> None:
    """Divergence (a) of the Jinja port: its dictsort ignores case; the encoder (and regen)
    sort by code point."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"Zeta": {"type": "string"}, "alpha": {"type": "string"}}
    }}}]  # fmt: skip
    msgs = [{"role": "user", "content": "hi"}]
    ours = Renderer(tokenizer, {}, family=KIMI_K3).render_prompt(msgs, tools, "sglang")
    port = K3Tokenizer(tokenizer, TEMPLATE.read_text(encoding="utf-8"))
    assert '"Zeta":{"type":"string"},"alpha"' in ours
    assert '"alpha":{"type":"string"},"Zeta"' in port.apply_chat_template(msgs, tools=tools)


# -- the answer: both engines' parsers ----------------------------------------------------------
ON, OFF = {"thinking": True, "thinking_effort": "max"}, {"thinking": False}


def arg(key: str, kind: str, value: str) -> str:
    return f'<|open|>argument key="{key}" type="{kind}"<|sep|>{value}<|close|>argument<|sep|>'


def call_text(i: int, name: str, *args: str) -> str:
    return f'<|open|>call tool="{name}" index="{i}"<|sep|>{"".join(args)}<|close|>call<|sep|>'


W = call_text(1, "get_weather", arg("city", "string", "Rome"), arg("days", "number", "3"),
              arg("units", "object", '{"temp": "C"}'))  # fmt: skip
T = call_text(2, "get_time", arg("zone", "string", "CET"), arg("utc", "boolean", "true"),
              arg("skip", "null", "null"), arg("fields", "array", '["hour", 2]'),
              arg("offset", "number", "1.5"))  # fmt: skip
THINK = f"Rome needs a lookup.{THINK_CLOSE}"
ESCAPED = arg("a&quot;b", "string", "x")
COMPACT = arg("units", "object", '{"t":1}')


def answer(body: str, calls: str = "") -> str:
    tools = f"{TOOLS_OPEN}{calls}{TOOLS_CLOSE}" if calls else ""
    return f"{RESPONSE_OPEN}{body}{RESPONSE_CLOSE}{tools}{MESSAGE_END}"


REDUMPED = "both engines return json.dumps of the arguments: compact JSON comes back spaced"
NO_RESPONSE = "the model went from its reasoning straight to the tools channel: the rebuild " \
              "writes the empty response channel the template writes"  # fmt: skip
SKIPPED = "the model wrote no think channel: SGLang returns the answer as content, vLLM as " \
          "reasoning; the rebuild writes the channels the template writes"  # fmt: skip
CASES = {
    "reasoning and answer": Case(f"{THINK}{answer('It is sunny.')}", "open", kwargs=ON),
    "empty reasoning": Case(f"{THINK_CLOSE}{answer('Hi.')}", "open", kwargs=ON),
    "one call": Case(f"{THINK}{answer('Checking Rome.', W)}", "open", calls=1, kwargs=ON),
    "two calls, no content": Case(f"{THINK}{answer('', W + T)}", "open", calls=2, kwargs=ON),
    "thinking off": Case(f"Hello!{RESPONSE_CLOSE}{MESSAGE_END}", "closed", kwargs=OFF),
    "a call, thinking off": Case(f"{RESPONSE_CLOSE}{TOOLS_OPEN}{W}{TOOLS_CLOSE}{MESSAGE_END}",
                                 "closed", calls=1, kwargs=OFF),
    "a string that looks like JSON": Case(
        f"{THINK}{answer('', call_text(1, 'get_weather', arg('city', 'string', '42')))}",
        "open", calls=1, kwargs=ON),
    "escaped key and text with markup": Case(
        f"{THINK}{answer('a < b & c', call_text(1, 'get_weather', ESCAPED))}", "open", calls=1,
        kwargs=ON),
    "compact JSON": Case(
        f"{THINK}{answer('', call_text(1, 'get_weather', COMPACT))}", "open", calls=1, kwargs=ON,
        sglang_differs=REDUMPED, vllm_differs=REDUMPED),
    "straight to the tools": Case(
        f"{THINK}{TOOLS_OPEN}{W}{TOOLS_CLOSE}{MESSAGE_END}", "open", calls=1, kwargs=ON,
        sglang_differs=NO_RESPONSE, vllm_differs=NO_RESPONSE),
    "no think channel": Case(f"Hi.{RESPONSE_CLOSE}{MESSAGE_END}", "open", kwargs=ON,
                             sglang_differs=SKIPPED, vllm_differs=SKIPPED),
    "cut in the reasoning": Case("Rome needs", "open", finish="length", kwargs=ON),
    "cut in the answer": Case(f"{THINK}{RESPONSE_OPEN}It is su", "open", finish="length",
                              kwargs=ON),
}  # fmt: skip
CASES_TEXT = [c.text for c in CASES.values()]
SPECIAL = [t for t, _ in K3_TOKENS]


def sglang_sees(case: Case) -> str:
    """The text SGLang's parsers get for a request with tools: the end token is a stop token,
    and ``<|close|>tools<|sep|>`` a stop string, trimmed with what follows."""
    text = strip_end(KIMI_K3, case.text)
    return text.split(TOOLS_CLOSE)[0]


@pytest.fixture(scope="module")
def detector():
    without_xgrammar()
    return sglang("function_call.kimik3_detector").KimiK3Detector()


def without_xgrammar() -> None:
    """kimik3_detector.py imports xgrammar's structural-tag classes at the top for its grammar
    methods, which parsing never calls; where xgrammar is not installed (it is no dependency of
    regen) empty stand-ins take their names."""
    if importlib.util.find_spec("xgrammar") is not None or "xgrammar" in sys.modules:
        return
    root, tags = types.ModuleType("xgrammar"), types.ModuleType("xgrammar.structural_tag")
    root.__path__ = []  # type: ignore[attr-defined]
    tags.__getattr__ = _stand_in  # type: ignore[method-assign]
    root.StructuralTag = type("StructuralTag", (), {})  # type: ignore[attr-defined]
    root.structural_tag = tags  # type: ignore[attr-defined]
    sys.modules.update({"xgrammar": root, "xgrammar.structural_tag": tags})


def _stand_in(name: str) -> type:
    """An empty class for any structural-tag name; a module's own dunders (``__file__``, which
    torch and inspect look up on every module) stay absent, as on a real module."""
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (), {})


def sglang_result(case: Case, detector) -> tuple:
    force = bool(case.kwargs.get("thinking"))  # serving_chat: reasoning_default "thinking"
    return sglang_parse(sglang_sees(case), KIMI_K3.sglang.reasoning, detector, force=force)


@pytest.mark.parametrize("name", list(CASES))
def test_sglang_round_trip(detector, name: str) -> None:
    case = CASES[name]
    reasoning, content, calls = sglang_result(case, detector)
    assert len(calls) == case.calls, (reasoning, content, calls)
    check(case, rebuild(KIMI_K3, case, reasoning, content, calls), case.sglang_differs)


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, dict]:
    results = vllm_parse(KIMI_K3, list(CASES.values()), SPECIAL, composed=True)
    return dict(zip(CASES, results, strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_round_trip(vllm_results, name: str) -> None:
    case, got = CASES[name], vllm_results[name]
    assert "error" not in got, got
    calls = vllm_calls(got)
    assert len(calls) == case.calls, got
    assert got["skip_special_tokens"] is False
    rebuilt = rebuild(KIMI_K3, case, got["reasoning"], got["content"], calls)
    check(case, rebuilt, case.vllm_differs)


def test_vllm_gives_no_reasoning_for_an_empty_think_channel(vllm_results) -> None:
    got = vllm_results["empty reasoning"]
    assert got["reasoning"] is None and got["content"] == "Hi."
    assert KIMI_K3.split_response("open", None, "Hi.") == (None, "Hi.", None)


def test_ids_of_the_rebuilt_text(detector) -> None:
    for name, case in CASES.items():
        if not case.sglang_differs:
            rebuilt = rebuild(KIMI_K3, case, *sglang_result(case, detector))
            assert same_ids(SPECIAL, case.text, rebuilt), name


def test_a_parser_less_servers_text() -> None:
    """Raw output (special tokens kept): split at the think close, unwrapped; a tools channel
    no parser took apart is flagged."""
    raw = strip_end(KIMI_K3, CASES["reasoning and answer"].text)
    reasoning, content, flag = KIMI_K3.split_response("open", None, raw)
    assert (reasoning, content, flag) == ("Rome needs a lookup.", "It is sunny.", None)
    assert KIMI_K3.response_text("open", reasoning, content) == CASES["reasoning and answer"].text
    raw = strip_end(KIMI_K3, CASES["one call"].text)
    assert KIMI_K3.split_response("open", None, raw)[2] == "content_has_think"
    raw = strip_end(KIMI_K3, CASES["no think channel"].text)
    assert KIMI_K3.split_response("open", None, raw) == (None, "Hi.", "think_inserted")
    raw = strip_end(KIMI_K3, CASES["thinking off"].text)
    assert KIMI_K3.split_response("closed", None, raw) == (None, "Hello!", None)


def test_the_rebuild_of_truncated_and_unknown_turns() -> None:
    calls = [ToolCall("c", "get_weather", '{"city": "Rome"}')]
    one = call_text(1, "get_weather", arg("city", "string", "Rome"))
    assert KIMI_K3.response_text("open", "R", "C", calls, "length") == (
        f"R{THINK_CLOSE}{RESPONSE_OPEN}C{RESPONSE_CLOSE}{TOOLS_OPEN}{one}{TOOLS_CLOSE}"
    )
    assert KIMI_K3.response_text("closed", "", "C", (), "length") == "C"
    assert KIMI_K3.response_text("none", None, "C") == answer("C")
    assert KIMI_K3.response_text("none", "R", "C") == f"{THINK_OPEN}R{THINK_CLOSE}{answer('C')}"
    assert KIMI_K3.response_text("none", "R", "", (), "length") == f"{THINK_OPEN}R"
    with pytest.raises(TemplateError, match="thinking"):
        KIMI_K3.response_text("closed", "R", "C")
    text_args = [ToolCall("c", "get_weather", "city=Rome")]
    assert '<|open|>json type="object"<|sep|>city=Rome<|close|>json<|sep|>' in \
        KIMI_K3.tool_calls_text(text_args)  # fmt: skip
    assert KIMI_K3.cut_close() is None


# -- the family record --------------------------------------------------------------------------
def test_the_family_record() -> None:
    assert KIMI_K3.name == "kimi_k3" and KIMI_K3.encodes_prompts
    assert KIMI_K3.end_tokens() == (END_OF_MSG,)
    assert KIMI_K3.think == (THINK_OPEN, THINK_CLOSE)
    assert KIMI_K3.efforts == ("max", "low", "high")
    assert KIMI_K3.template_kwargs(True) == {"thinking": True, "thinking_effort": "max"}
    assert KIMI_K3.template_kwargs("low") == {"thinking": True, "thinking_effort": "low"}
    assert KIMI_K3.template_kwargs(False) == {"thinking": False}
    assert KIMI_K3.request_fields(True) == {}
    assert KIMI_K3.sglang_flags() == ["--tool-call-parser", "kimi_k3", "--reasoning-parser",
                                      "kimi_k3"]  # fmt: skip
    assert KIMI_K3.vllm_flags() == [
        "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3", "--reasoning-parser",
        "kimi_k3", "--tokenizer-mode", "kimi_k3"]  # fmt: skip
    assert KimiK3Family.vllm_tokenizer_mode == "kimi_k3"
    assert KIMI_K3.aux_shift == "unsupported" and KIMI_K3.sglang_arguments == "keep"
    assert KIMI_K3.remote_code and KIMI_K3.turn_open_tokens == ()
    assert KIMI_K3.call_markers == (TOOLS_OPEN, "<|open|>call")
    assert (PUBLISHED_IDS[END_OF_MSG], PUBLISHED_IDS[OPEN], VOCAB_SIZE) == (163586, 163587, 163840)


def test_the_engines_parser_names_exist() -> None:
    parsers = sglang("parser.reasoning_parser").ReasoningParser.DetectorMap
    assert KIMI_K3.sglang.reasoning in parsers
    # function_call_parser.py imports every detector (some need packages not installed here)
    import _sglang  # on the path _engines sets

    source = _sglang.wheel_root() / "srt" / "function_call" / "function_call_parser.py"
    assert f'"{KIMI_K3.sglang.tool}": KimiK3Detector,' in source.read_text(encoding="utf-8")


# -- recognition: K3 against K2.6 ---------------------------------------------------------------
#: a K3 folder's tokens (tokenizer_config.json added_tokens_decoder, third-party copies)
K3_FOLDER_TOKENS = frozenset({
    "[BOS]", "[EOS]", END_OF_MSG, OPEN, CLOSE, SEP, "[start_header_id]", "[end_header_id]",
    "[EOT]", "<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>", "[UNK]",
    "[PAD]",
})  # fmt: skip
#: what tokenization_kimi.py's default additional_special_tokens names (K2's): a K3 folder
#: whose special_tokens_map.json kept them still lacks K2's tool-call tokens
K2_DEFAULTS = frozenset({
    "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|start_header_id|>", "<|end_header_id|>",
    "[EOT]", "<|im_system|>", "<|im_middle|>",
})  # fmt: skip
K3_FACTS = [
    TokenizerFacts("", K3_FOLDER_TOKENS, "kimi_k3"),
    TokenizerFacts("", K3_FOLDER_TOKENS, None),
    TokenizerFacts("", K3_FOLDER_TOKENS | K2_DEFAULTS, "kimi_k3"),
    TokenizerFacts("", frozenset({"[BOS]", "[EOS]"}), "kimi_k3"),
]
K26_FACTS = TokenizerFacts(
    "{%- for message in messages -%}<|im_assistant|>assistant<|im_middle|>…<|im_end|>",
    frozenset({*k2.PUBLISHED_IDS, "<|media_pad|>", "<|media_begin|>"}),
    "kimi_k25",
)


def test_k3_is_recognised_and_k2_is_not_taken_for_it() -> None:
    for facts in K3_FACTS:
        assert KIMI_K3.recognises(facts), facts
        assert not k2.KIMI.recognises(facts), facts
        others = [f.name for f in FAMILIES.values() if f.name != "kimi_k3" and f.recognises(facts)]
        assert others == [], facts
    assert k2.KIMI.recognises(K26_FACTS)
    assert not KIMI_K3.recognises(K26_FACTS)


def test_k3_takes_no_other_familys_tokenizer() -> None:
    for fam in FAMILIES.values():
        if fam.name == "kimi_k3":
            continue
        tokens = frozenset((*fam.special_tokens, *(fam.think or ()), *fam.published_ids))
        model = fam.model_types[0] if fam.model_types else None
        assert not KIMI_K3.recognises(TokenizerFacts("", tokens, model)), fam.name


def test_a_k3_folder_is_read_as_k3(tmp_path: Path) -> None:
    config = {"tokenizer_class": "TikTokenTokenizer", "added_tokens_decoder": {
        str(i): {"content": t, "special": t not in (OPEN, CLOSE, SEP)}
        for t, i in PUBLISHED_IDS.items()}}  # fmt: skip
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
         "text_config": {"model_type": "kimi_linear", "vocab_size": VOCAB_SIZE}}))  # fmt: skip
    facts = read_facts(str(tmp_path))
    assert facts.model_type == "kimi_k3" and facts.chat_template == ""
    assert KIMI_K3.recognises(facts) and not k2.KIMI.recognises(facts)
    assert set(SPECIAL_TOKENS) <= facts.tokens
