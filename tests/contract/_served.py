"""What each engine hands a chat template, computed by the engines' own code: the witness of
regen.template.prepare.

- SGLang 0.5.23, in this process, from the wheel (:mod:`_sglang`): its protocol models
  (``ChatCompletionRequest``), ``function_call/utils.py`` ``normalize_json_schema_types``,
  ``parser/jinja_template_utils.py`` ``process_content_for_template_format`` and
  ``detect_jinja_template_content_format``, and three module-level functions of
  ``entrypoints/openai/serving_chat.py`` (``parse_tool_call_arguments``,
  ``normalize_assistant_tool_call_arguments``, ``normalize_tool_content``), compiled from that
  file's own source (the module itself imports the whole server). :func:`sglang_inputs`
  follows ``_apply_jinja_template``'s default (Jinja) path.
- vLLM 0.32, in the vLLM environment's worker process (``_served_vllm.py``): the request
  validated by its ``ChatCompletionRequest``, ``renderers/chat_utils.py``
  ``parse_chat_messages`` under the content format ``renderers/hf.py``
  ``_detect_content_format`` finds, the tools' ``model_dump()``, then the tokenizer's
  ``apply_chat_template`` with that template: the prompt text vLLM renders.
"""

from __future__ import annotations
import __future__

import copy
import functools
import sys
import types
from pathlib import Path
from typing import Any

import _sglang

HERE = Path(__file__).resolve().parent
#: seconds a vLLM worker call may take (the worker's first call imports vLLM: about 10 s)
VLLM_TIMEOUT_S = 180
_SERVING_CHAT_FUNCTIONS = (
    "parse_tool_call_arguments", "normalize_assistant_tool_call_arguments",
    "normalize_tool_content",
)  # fmt: skip


@functools.cache
def _serving_chat() -> dict[str, Any]:
    """The module-level functions of SGLang's serving_chat.py that prepare messages."""
    ns: dict[str, Any] = {"orjson": __import__("orjson"), "Any": Any}
    # annotations deferred, as the file itself has them
    _sglang.wheel_exec("srt/entrypoints/openai/serving_chat.py", _SERVING_CHAT_FUNCTIONS, ns,
                       flags=__future__.annotations.compiler_flag)  # fmt: skip
    return ns


@functools.cache
def _jinja_utils() -> types.ModuleType:
    """``parser/jinja_template_utils.py`` (its three names of ``sglang.srt.utils``, a package
    that imports torch, stood in for: media records the text path never builds)."""
    if "sglang.srt.utils" not in sys.modules:
        _sglang.load("sglang.srt.entrypoints.openai.protocol")  # the parents
        utils = types.ModuleType("sglang.srt.utils")
        utils.__path__ = []  # type: ignore[attr-defined]
        utils.GLM_MEDIA_CONFIG_KEYS = ()  # type: ignore[attr-defined]
        utils.ImageData = dict  # type: ignore[attr-defined]
        utils.VideoData = dict  # type: ignore[attr-defined]
        sys.modules["sglang.srt.utils"] = utils
    return _sglang.load("sglang.srt.parser.jinja_template_utils")


def sglang_content_format(template: str) -> str:
    """SGLang's content format for a template (``string`` or ``openai``)."""
    return _jinja_utils().detect_jinja_template_content_format(template)


def sglang_inputs(
    body: dict[str, Any], template: str, *, strict: bool = True
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and tools SGLang hands ``template`` for the request ``body``; ValueError
    where it refuses the request (its 400)."""
    protocol = _sglang.load("sglang.srt.entrypoints.openai.protocol")
    schema = _sglang.load("sglang.srt.function_call.utils")
    fns = _serving_chat()
    utils = _jinja_utils()
    request = protocol.ChatCompletionRequest.model_validate(copy.deepcopy(body))
    for tool in request.tools or ():
        if tool.function.parameters is not None:
            schema.normalize_json_schema_types(tool.function.parameters)
    tools = None
    if request.tools and request.tool_choice != "none":
        tools = [t.model_dump() for t in request.tools]
    fmt = utils.detect_jinja_template_content_format(template)
    messages = [m.model_dump() for m in request.messages]
    for m in messages:
        fns["normalize_assistant_tool_call_arguments"](m, strict=strict)
    out = []
    for m in messages:
        if m.get("content") is None:
            m["content"] = ""
        got = utils.process_content_for_template_format(m, fmt, [], [], [], [])
        got["content"] = fns["normalize_tool_content"](got["role"], got.get("content"))
        out.append(got)
    return out, tools


def vllm_prompts(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each job (``tokenizer``: a folder, ``template``: the Jinja text, ``body``: a request,
    ``kwargs``: chat_template_kwargs) rendered as vLLM 0.32 renders it, in one call of the vLLM
    environment's worker: ``{"prompt", "format"}`` or ``{"error"}`` each (skips where the
    environment is missing)."""
    if str(HERE.parent) not in sys.path:
        sys.path.insert(0, str(HERE.parent))
    from _vllm_call import vllm_call

    return vllm_call(HERE / "_served_vllm.py", jobs, timeout_s=VLLM_TIMEOUT_S)
