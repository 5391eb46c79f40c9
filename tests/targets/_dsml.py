"""Shared by the DeepSeek-V3.2 / V4 / V4.1 (DSML) contract tests: a tiny tokenizer folder with
the DeepSeek tokens and no chat template, the engines' own prompt paths (SGLang in this
process, vLLM in its environment's worker process, ``_vllm_call.py``), regen's render through
the Renderer, and the conversations every encoder test renders.

- SGLang 0.5.23, V3.2: ``serving_chat.py`` ``_apply_jinja_template``'s dsv32 branch, step by
  step over the wheel's own protocol models and functions (:mod:`_served` compiles the
  module-level ones), then ``encoding_dsv32.encode_messages`` and ``tokenizer.encode``;
- SGLang 0.5.23, V4 / V4.1: the wheel's ``DeepSeekRecipeChatEncodingAdapter``
  (``serving_deepseek_recipe.py``) itself, over deepseek-recipe: its ``encode_messages`` gives
  the prompt ids, and its ``parse_chat_response`` parses the output ids;
- vLLM 0.32: ``_vllm_dsml_render.py`` (the server's renderer for the tokenizer mode).
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _engines import HERE, sglang
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from regen.targets.family import Family, Thinking
from regen.template.render import Renderer
from regen.template.tokenizer import load_tokenizer

sys.path.insert(0, str(HERE.parent / "contract"))
import _served
from _vllm_call import vllm_call

#: the DeepSeek tokens of the tiny tokenizer in the real tokenizers' id order (0, 1, 2, then
#: the 1288xx block), with their ``special`` flag
TOKENS: tuple[tuple[str, bool], ...] = (
    ("<｜begin▁of▁sentence｜>", True),
    ("<｜end▁of▁sentence｜>", True),
    ("<｜▁pad▁｜>", True),
    ("<｜System｜>", False),
    ("<｜User｜>", False),
    ("<｜Assistant｜>", False),
    ("<think>", False),
    ("</think>", False),
    ("｜DSML｜", False),
    ("<｜latest_reminder｜>", False),
)
BOS, EOS, PAD = (t for t, _ in TOKENS[:3])
VLLM_TIMEOUT_S = 240


@dataclass(frozen=True, slots=True)
class Markup:
    """How a DSML version writes its calls: each tag is ``｜DSML｜`` + ``sep`` + its name, in a
    block named ``block`` (V3.2 ``function_calls``, V4 ``tool_calls``, V4.1 ``calls`` and a
    space after the marker)."""

    block: str
    sep: str = ""

    def invoke(self, name: str, *params: tuple[str, str, str]) -> str:
        """A call as the model writes it; ``params``: (key, string flag, value)."""
        tag = f"｜DSML｜{self.sep}"
        body = "\n".join(
            f'<{tag}parameter name="{k}" string="{flag}">{v}</{tag}parameter>'
            for k, flag, v in params
        )
        return f'<{tag}invoke name="{name}">\n{body}\n</{tag}invoke>'

    def calls(self, *invokes: str) -> str:
        """The block of ``invokes``."""
        tag = f"｜DSML｜{self.sep}{self.block}"
        return f"<{tag}>\n" + "\n".join(invokes) + f"\n</{tag}>"


V32_MARKUP, V4_MARKUP, V41_MARKUP = (
    Markup("function_calls"),
    Markup("tool_calls"),
    Markup("calls", " "),
)


# -- the conversations ------------------------------------------------------------------------
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "Città, e.g. Zürich"},
        "days": {"type": "integer"},
        "options": {"type": "object", "properties": {"units": {"type": "string"}}}},
        "required": ["city"]}}}  # fmt: skip
#: keys in another order and no description: the engines' tool models reshape it
SEARCH = {"type": "function", "function": {
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    "name": "search"}}  # fmt: skip
TOOLS = [WEATHER, SEARCH]
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
ARGS_1 = {"city": "Zürich", "days": 2, "options": {"units": "°C", "list": [1, 2.5, None, True]}}


def call(i: str, name: str, args: Any) -> dict[str, Any]:
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"id": i, "type": "function", "function": {"name": name, "arguments": text}}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(content: str, reasoning: str | None = None, calls: list | None = None) -> dict:
    m: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    if calls:
        m["tool_calls"] = calls
    return m


def result(i: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": i, "content": text}


AGENT = [
    user("Wetter in Zürich? And search the news."),
    assistant("Let me check.", "I need two tools.", [
        call("c1", "get_weather", ARGS_1), call("c2", "search", {"query": "news\nline two"})]),
    result("c2", "No news."),
    result("c1", '{"temp": 20, "sky": "clear"}'),
    assistant("It is 20°C and clear.", "Both results are in."),
    user("Thanks! And tomorrow?"),
]  # fmt: skip
#: name -> (messages, tools)
CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "one user turn": ([user("Hello!")], None),
    "system, several turns": ([SYSTEM, user("Where is Paris?"),
                               assistant("In France.", "Easy geography."), user("And Rome?"),
                               assistant("In Italy.", "Also easy."), user("Thanks!")], None),
    "system, tools, calls, results, next user turn": ([SYSTEM, *AGENT], TOOLS),
    "tools without a system message": (AGENT, TOOLS),
    "ends on the tool results": ([SYSTEM, *AGENT[:4]], TOOLS),
    "call without reasoning, then results": ([
        user("Search the news."),
        assistant("", None, [call("c1", "search", {"query": "news"})]),
        result("c1", "Nothing."),
    ], TOOLS),
    "two user messages in a row": ([user("First."), user("Second.")], None),
}  # fmt: skip


#: where vLLM and SGLang's deepseek-recipe render V4 / V4.1 differently (regen follows each)
EDGES: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "a developer message mid-conversation": ([
        user("Hi"), assistant("Hello", "greet"), {"role": "developer", "content": "Be brief."},
        user("Weather?")], None),
    "a later system message, tools": ([
        user("Hi"), assistant("Hello", "greet"), {"role": "system", "content": "Be terse."},
        user("Weather?")], TOOLS),
    "two answers in a row": ([
        user("Hi"), assistant("Hello", "r1"), assistant("Again", "r2"), user("Ok")], None),
    "an empty system message": ([{"role": "system", "content": ""}, user("Hi")], None),
    "a system message, then an answer": ([SYSTEM, assistant("Hi there", "r"), user("Hi")], None),
    "history arguments that are not an object": ([
        user("Go"), assistant("", "r", [call("c1", "search", "[1, 2]")]), result("c1", "x")],
        TOOLS),
    "numbers in the arguments": ([
        user("Go"), assistant("", "r", [call("c1", "get_weather",
            '{"city": "X", "a": 1e-7, "b": 0.00001234, "c": 1e16, "d": 18446744073709551616}')]),
        result("c1", "x")], TOOLS),
}  # fmt: skip


# -- the tiny tokenizer -----------------------------------------------------------------------
def build_tokenizer(folder: Path) -> Path:
    """A byte-level BPE without merges (every byte one id) and :data:`TOKENS` on top, no chat
    template; ``config.json`` a tiny Llama (what vLLM's ModelConfig loads)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    for text, special in TOKENS:
        added = [AddedToken(text, special=special, normalized=False)]
        (tok.add_special_tokens if special else tok.add_tokens)(added)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
              "pad_token": PAD, "add_bos_token": False, "add_eos_token": False,
              "clean_up_tokenization_spaces": False}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    model = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
             "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32768,
             "rms_norm_eps": 1e-6, "bos_token_id": 256, "eos_token_id": 257,
             "torch_dtype": "float32"}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(model))
    return folder


# -- the request regen sends, and regen's render ----------------------------------------------
def request(
    family: Family, messages: list, tools: list | None, thinking: Thinking, extra: dict | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The chat request regen sends (its ``chat_template_kwargs`` and top-level fields) and
    the template kwargs of its own render."""
    kwargs = {**family.template_kwargs(thinking), **(extra or {})}
    body: dict[str, Any] = {
        "model": "m",
        "messages": copy.deepcopy(messages),
        "chat_template_kwargs": kwargs,
        **family.request_fields(thinking),
    }
    if tools:
        body["tools"] = copy.deepcopy(tools)
    return body, kwargs


def regen_render(
    folder: Path, family: Family, body: dict[str, Any], kwargs: dict[str, Any], engine: str
) -> tuple[str, list[int]]:
    """regen's prompt for the request on ``engine``: the Renderer's (engine preparation, then
    the family's encoder), and its ids."""
    renderer = Renderer(load_tokenizer(folder), kwargs, family)
    text = renderer.render_prompt(body["messages"], body.get("tools"), engine)
    return text, renderer.encode(text)


# -- SGLang -----------------------------------------------------------------------------------
def sglang_request(body: dict[str, Any]) -> tuple[Any, list[dict[str, Any]] | None]:
    """SGLang's request model and the tools its chat handler hands an encoder."""
    protocol = sglang("entrypoints.openai.protocol")
    schema = sglang("function_call.utils")
    req = protocol.ChatCompletionRequest.model_validate(copy.deepcopy(body))
    for tool in req.tools or ():
        if tool.function.parameters is not None:
            schema.normalize_json_schema_types(tool.function.parameters)
    tools = None
    if req.tools and req.tool_choice != "none":
        tools = [t.model_dump() for t in req.tools]
    return req, tools


def sglang_v32_prompt(body: dict[str, Any], hf: Any) -> tuple[str, list[int]]:
    """SGLang's dsv32 path (``_apply_jinja_template``): the prompt text and its ids."""
    encoding = sglang("entrypoints.openai.encoding_dsv32")
    utils = _served._jinja_utils()
    fns = _served._serving_chat()
    req, tools = sglang_request(body)
    thinking = (req.chat_template_kwargs or {}).get("thinking", False)
    messages = [m.model_dump() for m in req.messages]
    for m in messages:
        fns["normalize_assistant_tool_call_arguments"](m, strict=True)
    messages = copy.deepcopy(messages)
    for m in messages:
        if m.get("content") is None:
            m["content"] = ""
        m.update(utils.process_content_for_template_format(
            m, "string", [], [], [], [], use_dpsk_v32_encoding=True))  # fmt: skip
    last = messages[-1] if messages else None  # _handle_last_assistant_message
    if last and last["role"] == "assistant" and isinstance(last.get("content"), str):
        messages[-1] = {"role": "user", "content": last["content"]}
    if messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": ""})
    if tools:
        messages[0]["tools"] = tools
    text = encoding.encode_messages(messages, thinking_mode="thinking" if thinking else "chat")
    return text, list(hf.encode(text))


def recipe_adapter(spec: str, hf: Any) -> Any:
    """SGLang's DeepSeek-V4 / V4.1 chat encoding adapter (deepseek-recipe) over ``hf``."""
    _served._jinja_utils()  # stands in for sglang.srt.utils, which imports torch
    module = sglang("entrypoints.openai.serving_deepseek_recipe")
    adapters = sglang("entrypoints.openai.chat_encoding_adapters")
    hooks = adapters.ChatOutputHooks(
        thinking_requested=sglang_thinking,
        tool_call_parsing_active=lambda r: bool(r.tools) and r.tool_choice != "none",
        history_tool_calls_count=lambda r: 0,
        tool_call_id=lambda item, count: f"call_{item.tool_index}",
    )
    reasoning, tool = adapters.ADAPTER_OUTPUT_PARSERS[spec]
    return module.DeepSeekRecipeChatEncodingAdapter(
        chat_encoding_spec=spec, tokenizer=hf, reasoning_parser=reasoning, tool_call_parser=tool,
        chat_hooks=hooks, default_chat_template_kwargs=None,
    )  # fmt: skip


def sglang_thinking(req: Any) -> bool:
    """``serving_chat.py`` ``_thinking_requested`` (``SGLANG_DEFAULT_THINKING`` off)."""
    return bool((req.chat_template_kwargs or {}).get("thinking", False))


def sglang_recipe_prompt(body: dict[str, Any], adapter: Any, hf: Any) -> tuple[str, list[int]]:
    """SGLang's dsv4 / dsv41 path: the adapter's prompt ids, and their text."""
    req, tools = sglang_request(body)
    ids = adapter.encode_messages(messages=[], request=req, tools=tools,
                                  thinking=sglang_thinking(req), image_data=[])  # fmt: skip
    return hf.decode(ids, skip_special_tokens=False), list(ids)


def sglang_recipe_parse(adapter: Any, hf: Any, text: str, kwargs: dict, tools: list) -> dict:
    """The chat handler's non-streamed parse of the output ``text`` (ended by EOS)."""
    protocol = sglang("entrypoints.openai.protocol")
    req = protocol.ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [user("hi")], "tools": tools, "chat_template_kwargs": kwargs}
    )
    eos = hf.convert_tokens_to_ids(EOS)
    ids = hf.encode(text, add_special_tokens=False)
    ended = ids[-1:] == [eos]
    finish = {"type": "stop", "matched": eos} if ended else {"type": "length"}
    reasoning, content, calls, _ = adapter.parse_chat_response(
        request=req, output_ids=ids, finish_reason=finish)  # fmt: skip
    return {"reasoning": reasoning, "content": content,
            "calls": [[c.function.name, c.function.arguments] for c in calls or ()]}  # fmt: skip


# -- vLLM -------------------------------------------------------------------------------------
def vllm_renders(folder: Path, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each job (``mode``, ``body``) rendered by vLLM's server path, in one call of the vLLM
    environment's worker: ``{"prompt", "ids"}`` or ``{"error"}`` each (skips where the vLLM
    environment is missing)."""
    job = {"model": str(folder), "jobs": jobs}
    return vllm_call(HERE / "_vllm_dsml_render.py", job, timeout_s=VLLM_TIMEOUT_S)


def recipe_round_trip(family: Family, case: Any, adapter: Any, hf: Any, tools: list) -> str:
    """A case through SGLang's recipe parser (``parse_chat_response``, the request's
    ``chat_template_kwargs`` the case's) and the family's rebuild."""
    from _engines import rebuild, vllm_calls

    got = sglang_recipe_parse(adapter, hf, case.text, case.kwargs, tools)
    calls = vllm_calls(got)
    assert len(calls) == case.calls or case.sglang_differs, got
    return rebuild(family, case, got["reasoning"], got["content"], calls)


# -- the prompt contract ----------------------------------------------------------------------
def prompt_jobs(
    family: Family, settings: dict[str, tuple[Thinking, dict | None]], conversations: dict
) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Every conversation under every setting (``thinking`` and extra kwargs): the request
    regen sends and the kwargs of its render, by ``"{conversation} / {setting}"``."""
    return {
        f"{name} / {label}": request(family, messages, tools, thinking, extra)
        for name, (messages, tools) in conversations.items()
        for label, (thinking, extra) in settings.items()
    }


def recognised_by(facts: Any) -> list[str]:
    """Which DeepSeek families take a tokenizer (V3.1 and the three DSML ones)."""
    from regen.targets.deepseek import DEEPSEEK_V3
    from regen.targets.deepseek_v4 import DEEPSEEK_V4
    from regen.targets.deepseek_v32 import DEEPSEEK_V32
    from regen.targets.deepseek_v41 import DEEPSEEK_V41

    families = (DEEPSEEK_V3, DEEPSEEK_V32, DEEPSEEK_V4, DEEPSEEK_V41)
    return [f.name for f in families if f.recognises(facts)]


def _facts(tokens: Any, template: str = "", model_type: str | None = None) -> Any:
    from regen.targets.family import TokenizerFacts

    return TokenizerFacts(template, frozenset(tokens), model_type)


def recognition_cases() -> dict[str, tuple[Any, list[str]]]:
    """Tokenizers of the four DeepSeek chat formats (their distinguishing parts) and the
    families that must take each: ``(facts, [names])``."""
    from regen.devkit.tokenizers.tiny import DEEPSEEK_V3_TOKENS, TEMPLATES_DIR

    v31_template = (TEMPLATES_DIR / "deepseek_v3.jinja").read_text(encoding="utf-8")
    v3 = [t for t, _ in DEEPSEEK_V3_TOKENS]
    v4 = [*v3, "｜DSML｜", "<｜latest_reminder｜>", "<｜action｜>", "<｜query｜>"]
    v41 = [*v4, "<｜System｜>"]
    return {
        "V3.1: its template": (_facts(v3, v31_template), ["deepseek_v3"]),
        "V3.1: template and model type": (_facts(v3, v31_template, "deepseek_v3"), ["deepseek_v3"]),
        "V3.1 tokens, no template, V3 model type": (_facts(v3, "", "deepseek_v3"), []),
        "V3.2: model type": (_facts(v3, "", "deepseek_v32"), ["deepseek_v32"]),
        "V3.2: no template": (_facts(v3), ["deepseek_v32"]),
        "V3.2: a DSML template": (
            _facts(v3, "{{ '<｜DSML｜function_calls>' }}"), ["deepseek_v32"]),
        "V3.2: model type over a V3.1 template": (
            _facts(v3, v31_template, "deepseek_v32"), ["deepseek_v32"]),
        "V4: model type": (_facts(v4, "", "deepseek_v4"), ["deepseek_v4"]),
        "V4: tokens, a Llama model type": (_facts(v4, "", "llama"), ["deepseek_v4"]),
        "V4: a DSML template": (_facts(v4, "{{ '<｜DSML｜tool_calls>' }}"), ["deepseek_v4"]),
        "V4.1: model type": (_facts(v41, "", "deepseek_v41"), ["deepseek_v41"]),
        "V4.1: its system token": (_facts(v41), ["deepseek_v41"]),
        "V4.1: a DSML template": (_facts(v41, "{{ '<｜DSML｜ calls>' }}"), ["deepseek_v41"]),
        "V4.1 tokens, V4 model type": (_facts(v41, "", "deepseek_v4"), ["deepseek_v4"]),
        "not DeepSeek": (_facts(["<|im_start|>", "<|im_end|>", "<think>", "</think>"]), []),
    }  # fmt: skip
