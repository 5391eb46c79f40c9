"""What vLLM 0.32 and SGLang 0.5.23 do to a Kimi K3 request before K3's encoder
(:mod:`regen.targets.kimi_k3_encoding`) sees it; which engine gets which, and where each fact
was read: :mod:`regen.targets.kimi_k3`.

Owns no files. vLLM (``renderers/kimi_k3.py``): its reordering of tool results and its mapping of
the chat_template_kwargs (:func:`vllm_tool_order`, :func:`vllm_kwargs`). SGLang
(``entrypoints/openai/serving_chat.py`` ``_prepare_kimi_k3_messages``, ``_encode_messages``):
its preparation of the messages, its dump of the tools and the kwargs it hands on
(:func:`sglang_messages`, :func:`sglang_tools`, :func:`sglang_kwargs`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

from regen.core import jsontext
from regen.core.errors import TemplateError
from regen.core.tools import schema_types
from regen.targets.kimi_k3_encoding import EFFORTS, IMAGE_PLACEHOLDER

#: how SGLang neutralises an image placeholder a user typed
IMAGE_PLACEHOLDER_TYPED = "<| kimi_image_placeholder |>"
#: what SGLang hands the encoder for each image (``image_prompts``)
MEDIA_PAD = "<|media_pad|>"
#: the engine names whose preparation differs (regen.template.prepare)
SGLANG, VLLM = "sglang", "vllm"

# -- vLLM 0.32 (renderers/kimi_k3.py) -----------------------------------------------------------
#: the kwarg values vLLM's merge of the request's kwargs over its defaults leaves out
_UNSET = (None, "auto")


def vllm_kwargs(kwargs: Mapping[str, object]) -> dict[str, object]:
    """The chat_template_kwargs vLLM hands the encoder: those set to None or ``auto`` dropped
    (``renderers/params.py`` ``merge_kwargs`` under the serving defaults: an explicit
    ``thinking_effort: null`` is the tokenizer's ``max`` here, no effort on SGLang); then
    ``_apply_k3_thinking_kwargs``: ``enable_thinking`` → ``thinking``, a ``reasoning_effort``
    → ``thinking_effort`` (``none``: thinking off); any other effort refused."""
    kw = {k: v for k, v in kwargs.items() if v not in _UNSET}
    enable = kw.pop("enable_thinking", None)
    if enable is not None:
        kw.setdefault("thinking", enable)
    effort = kw.pop("reasoning_effort", None)
    if effort == "none":
        kw.setdefault("thinking", False)
    elif effort is not None:
        kw.setdefault("thinking_effort", effort)
    level = kw.get("thinking_effort")
    if level is not None and level not in EFFORTS:
        raise TemplateError(f"vLLM refuses thinking_effort {level!r} for Kimi K3 (HTTP 400; "
                            f"it takes {', '.join(EFFORTS)})")  # fmt: skip
    return kw


def vllm_tool_order(messages: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """``_normalize_k3_tool_messages``: the tool results right after an assistant turn with
    calls, in the calls' order, when each names one by its id or by ``"{name}:{position}"``
    (0-based), each given its call's ``tool`` and ``index``; else as they are."""
    out: list[dict[str, object]] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        out.append(dict(m))
        i += 1
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        if not calls:
            continue
        j = i
        while j < len(messages) and messages[j].get("role") == "tool":
            j += 1
        out += vllm_placed(messages[i:j], call_aliases(calls))
        i = j
    return out


def call_aliases(calls: object) -> dict[str, tuple[int, str]]:
    found: dict[str, tuple[int, str]] = {}
    for position, call in enumerate(jsontext.iterate(calls)):
        if not isinstance(call, Mapping):
            continue
        fn = call.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            continue
        aliases = [f"{name}:{position}"]
        if call.get("id"):
            aliases.insert(0, str(call["id"]))
        for alias in aliases:
            found.setdefault(alias, (position, name))
    return found


def vllm_placed(
    run: Sequence[Mapping[str, object]], aliases: Mapping[str, tuple[int, str]]
) -> list[dict[str, object]]:
    found = []
    for order, result in enumerate(run):
        key = result.get("tool_call_id")
        where = aliases.get(str(key)) if key is not None else None
        if where is None:
            return [dict(r) for r in run]
        found.append((where[0], order, {**result, "tool": where[1], "index": where[0] + 1}))
    return [r for _, _, r in sorted(found, key=lambda f: (f[0], f[1]))]


# -- SGLang 0.5.23 (serving_chat.py _prepare_kimi_k3_messages, _encode_messages) -----------------
def sglang_messages(
    messages: Sequence[Mapping[str, object]],
) -> tuple[list[dict[str, object]], int]:
    """``_prepare_kimi_k3_messages``; and the number of images (SGLang hands the encoder one
    ``<|media_pad|>`` image prompt each)."""
    out: list[dict[str, object]] = []
    images = 0
    for message in messages:
        m = copy.deepcopy(dict(message))
        body = m.get("content")
        if isinstance(body, list):
            parts = [p for p in map(sglang_part, body) if p is not None]
            m["content"] = parts
            images += sum(p["type"] == "image_url" for p in parts)
        elif isinstance(body, str):
            m["content"] = body.replace(IMAGE_PLACEHOLDER, IMAGE_PLACEHOLDER_TYPED)
        elif body is None:
            m["content"] = ""
        if m.get("role") == "assistant":
            for key in ("reasoning_content", "reasoning"):
                if key in m:
                    m[key] = typed_placeholders(m[key])
            for call in jsontext.iterate(m.get("tool_calls") or ()):
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict) and "arguments" in fn:
                    fn["arguments"] = typed_placeholders(fn["arguments"])
        if m.get("role") in ("system", "developer") and m.get("tools"):
            m["tools"] = [sglang_message_tool(t) for t in jsontext.iterate(m["tools"])]
        if m.get("role") == "developer":
            m["role"] = "system"
        out.append(m)
    return out, images


def sglang_part(part: object) -> dict[str, object] | None:
    if not isinstance(part, Mapping):
        return None
    if part.get("type") in ("text", "input_text"):
        return {"type": "text", "text": typed_placeholders(part["text"])}
    if part.get("type") in ("image_url", "input_image"):
        image = part.get("image_url") or {}
        if isinstance(image, str):
            image = {"url": image, "detail": part.get("detail")}
        return {"type": "image_url", "image_url": image}
    return None


def typed_placeholders(value: object) -> object:
    """``<|kimi_image_placeholder|>`` in every string of ``value`` made typed text."""
    if isinstance(value, str):
        return value.replace(IMAGE_PLACEHOLDER, IMAGE_PLACEHOLDER_TYPED)
    if isinstance(value, list):
        return [typed_placeholders(v) for v in value]
    if isinstance(value, dict):
        return {k: typed_placeholders(v) for k, v in value.items()}
    return value


#: the fields of SGLang's tool and function models (protocol.py ``Tool``, ``Function``)
_TOOL_FIELDS = ("type", "function", "defer_loading")
_FUNCTION_FIELDS = ("description", "name", "parameters", "strict", "defer_loading")


def sglang_message_tool(tool: object) -> dict[str, object]:
    """A system message's tool as SGLang's ``model_dump(exclude_unset=True)`` gives it: the
    fields the client set (a None ``strict`` / function ``defer_loading`` dropped, the tool's
    ``defer_loading`` copied into the function), parameter types made JSON Schema's."""
    if not isinstance(tool, Mapping):
        raise TemplateError(f"a Kimi K3 system message's tool must be an object, not {tool!r}")
    fn = _function(tool)
    spec = {k: copy.deepcopy(fn[k]) for k in fn if k in _FUNCTION_FIELDS}
    spec = {k: v for k, v in spec.items() if k not in ("strict", "defer_loading") or v is not None}
    if tool.get("defer_loading") is not None and spec.get("defer_loading") is None:
        spec["defer_loading"] = tool["defer_loading"]
    if spec.get("parameters") is not None:
        schema_types(spec["parameters"])
    out = {k: tool[k] for k in _TOOL_FIELDS if k in tool and k != "function"}
    return {**out, "function": spec}


def sglang_tools(tools: Sequence[Mapping[str, object]] | None) -> list[dict[str, object]] | None:
    """The request's tools as SGLang's K3 path dumps them (``exclude_unset``), from the shape
    regen.template.prepare gave them: what that preparation filled in (a None description,
    parameters or ``defer_loading``) dropped again. A client's own ``"description": null``
    cannot be told from none there: it is dropped too."""
    if not tools:
        return None
    out: list[dict[str, object]] = []
    for tool in tools:
        fn = {k: v for k, v in _function(tool).items()
              if v is not None or k not in ("description", "parameters")}  # fmt: skip
        top = {k: v for k, v in tool.items()
               if k != "function" and (v is not None or k != "defer_loading")}  # fmt: skip
        out.append({**top, "function": fn})
    return out


def _function(tool: Mapping[str, object]) -> Mapping[str, object]:
    """A tool's function (TemplateError where it is there but no object)."""
    fn = tool.get("function") or {}
    if not isinstance(fn, Mapping):
        raise TemplateError(f"a Kimi K3 tool's function must be an object, not {fn!r}")
    return fn


def sglang_kwargs(kwargs: Mapping[str, object]) -> dict[str, object]:
    """The chat_template_kwargs SGLang hands the encoder: as they are, less ``tokenize``,
    ``return_dict`` and ``image_prompts`` (``enable_thinking`` and ``reasoning_effort`` kwargs
    are not read)."""
    return {k: v for k, v in kwargs.items() if k not in ("tokenize", "return_dict",
                                                         "image_prompts")}  # fmt: skip
