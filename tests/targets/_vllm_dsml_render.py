"""Render chat requests as a vLLM 0.32 server renders a DeepSeek-V3.2 / V4 / V4.1 model, offline:
executed by the vLLM environment's Python (``.venv-vllm``), never imported by the tests
(``_dsml.vllm_renders`` runs it).

Reads one JSON object on stdin: ``model`` (a folder with ``config.json`` and a tokenizer),
``jobs`` (each ``mode``: the ``--tokenizer-mode``, ``body``: an OpenAI chat request). For each:
the renderer ``renderers/registry.py`` builds for that tokenizer mode (the V3.2 / V4 renderer
over the mode's tokenizer wrapper), the request validated by ``ChatCompletionRequest``, its
tools' ``model_dump()``, chat and tokenize params built as ``online_renderer.py``
``preprocess_chat`` builds them, then ``render_chat``: the prompt text and the ids the server
feeds the engine. Writes a JSON list: per job ``{"prompt", "ids"}``, or ``{"error"}`` where
vLLM refuses the request.
``handle(job)`` gives that list: the tests run it in the vLLM environment's long-lived
worker (``tests/_vllm_call.py``); run as a script, it reads stdin and writes stdout.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from vllm.config import ModelConfig, VllmConfig
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.renderers.params import merge_kwargs
from vllm.renderers.registry import renderer_from_config


def render(renderer: Any, config: ModelConfig, body: dict[str, Any]) -> dict[str, Any]:
    request = ChatCompletionRequest.model_validate(body)
    tools = None
    if request.tools is not None and request.tool_choice != "none":
        tools = [t.model_dump() for t in request.tools]
    defaults = merge_kwargs(None, {"tools": tools, "tokenize": False})
    chat_params = request.build_chat_params(None, "auto").with_defaults(defaults)
    tok_params = request.build_tok_params(config)
    _, (engine_input,) = renderer.render_chat([request.messages], chat_params, tok_params)
    ids = list(engine_input["prompt_token_ids"])
    prompt = engine_input.get("prompt")
    if prompt is None:
        prompt = renderer.get_tokenizer().decode(ids, skip_special_tokens=False)
    return {"prompt": prompt, "ids": ids}


def handle(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The results of a job (the JSON object described above)."""
    renderers: dict[str, tuple[Any, ModelConfig]] = {}
    out = []
    for item in job["jobs"]:
        mode = item["mode"]
        if mode not in renderers:
            config = ModelConfig(model=job["model"], tokenizer_mode=mode, max_model_len=32768)
            renderers[mode] = (renderer_from_config(VllmConfig(model_config=config)), config)
        renderer, config = renderers[mode]
        try:
            out.append(render(renderer, config, item["body"]))
        except Exception as e:  # vLLM answers these with a 400
            out.append({"error": f"{type(e).__name__}: {e}"})
    return out


def main() -> None:
    logging.disable(logging.WARNING)
    json.dump(handle(json.load(sys.stdin)), sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
