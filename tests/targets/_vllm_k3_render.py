"""Render Kimi K3 prompts as vLLM 0.32 does, offline: executed by the vLLM environment's Python
(``.venv-vllm``), never imported by the tests (test_kimi_k3_contract.py runs it).

Reads one JSON object on stdin: ``tokenizer`` (a tokenizer folder; its Jinja renderer only),
``template`` (the path of the K3 Jinja port) and ``bodies`` (OpenAI chat requests, their
``chat_template_kwargs`` included). Each request goes the way vLLM's chat serving sends a
``KimiK3ForConditionalGeneration`` model's (tokenizer mode ``kimi_k3``):
``ChatCompletionRequest`` validation; the tools' ``model_dump()`` and the default kwargs
``tools`` / ``tokenize`` merged under the request's (``renderers/online_renderer.py``
``preprocess_chat``); ``build_chat_params``; then ``renderers/kimi_k3.py``
``KimiK3Renderer.render_messages`` itself (``parse_chat_messages`` with the string content
format, ``_normalize_k3_tool_messages``, ``_apply_chat_template``: the thinking kwargs, then the
tokenizer) with the stand-in K3 tokenizer of ``_k3_stand.py``. Writes a JSON list: per request
``{"prompt", "kwargs"}`` (the text, and what reached the tokenizer), or ``{"error"}`` where vLLM
refuses it.
``handle(job)`` gives that list: the tests run it in the vLLM environment's long-lived
worker (``tests/_vllm_call.py``); run as a script, it reads stdin and writes stdout.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path
from typing import Any

from _k3_stand import K3Tokenizer
from transformers import AutoTokenizer
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.renderers.kimi_k3 import KimiK3Renderer
from vllm.renderers.params import merge_kwargs

#: what parse_chat_messages reads of the model config (a text-only K3)
MODEL_CONFIG = types.SimpleNamespace(
    multimodal_config=None,
    hf_config=types.SimpleNamespace(model_type="kimi_k3"),
    allowed_local_media_path="",
    allowed_media_domains=None,
    enable_prompt_embeds=False,
)


def render(stand: K3Tokenizer, body: dict[str, Any]) -> dict[str, Any]:
    request = ChatCompletionRequest.model_validate(body)
    tools = [t.model_dump() for t in request.tools] if request.tools is not None else None
    defaults = merge_kwargs(None, {"tools": tools, "tokenize": False})
    params = request.build_chat_params(None, "string").with_defaults(defaults)
    renderer = KimiK3Renderer.__new__(KimiK3Renderer)
    renderer.model_config = MODEL_CONFIG  # type: ignore[misc]
    renderer.get_tokenizer = lambda: stand  # type: ignore[method-assign]
    renderer.render_messages(request.messages, params)
    kwargs = {k: v for k, v in stand.calls[-1].items() if k != "tools"}
    return {"prompt": stand.rendered, "kwargs": kwargs}


def handle(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The results of a job (the JSON object described above)."""
    hf = AutoTokenizer.from_pretrained(job["tokenizer"])
    stand = K3Tokenizer(hf, Path(job["template"]).read_text(encoding="utf-8"))
    out = []
    for body in job["bodies"]:
        try:
            out.append(render(stand, body))
        except Exception as e:  # vLLM answers these with a 400
            out.append({"error": f"{type(e).__name__}: {e}"})
    return out


def main() -> None:
    logging.disable(logging.WARNING)
    json.dump(handle(json.load(sys.stdin)), sys.stdout, default=str)


if __name__ == "__main__":
    main()
