"""Render requests as vLLM 0.32 renders them, offline: executed by the vLLM environment's
Python (``.venv-vllm``), never imported by the tests (``_served.vllm_prompts`` runs it).

Reads a JSON list of jobs on stdin (``tokenizer``: a tokenizer folder, ``template``: the Jinja
text the server renders with, ``body``: an OpenAI chat request, ``kwargs``: its
chat_template_kwargs). For each: the request validated by vLLM's ``ChatCompletionRequest``,
its messages through ``parse_chat_messages`` under the content format ``_detect_content_format``
finds for the template, its tools' ``model_dump()``, then ``apply_chat_template`` with
``add_generation_prompt`` as ``renderers/hf.py`` calls it. Writes a JSON list: per job
``{"prompt", "format"}``, or ``{"error", "format"}`` where vLLM refuses the request.
``handle(job)`` gives that list: the tests run it in the vLLM environment's long-lived
worker (``tests/_vllm_call.py``); run as a script, it reads stdin and writes stdout.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from typing import Any

from transformers import AutoTokenizer
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.renderers.chat_utils import parse_chat_messages
from vllm.renderers.hf import _detect_content_format


def render(tok: Any, job: dict[str, Any], fmt: str) -> dict[str, Any]:
    request = ChatCompletionRequest.model_validate(job["body"])
    config = types.SimpleNamespace(enable_prompt_embeds=False, multimodal_config=None)
    conversation, _, _ = parse_chat_messages(request.messages, config, fmt)
    tools = [t.model_dump() for t in request.tools] if request.tools else None
    prompt = tok.apply_chat_template(
        conversation, tools=tools, chat_template=job["template"], tokenize=False,
        add_generation_prompt=True, continue_final_message=False, return_dict=False,
        **(job.get("kwargs") or {}),
    )  # fmt: skip
    return {"prompt": prompt, "format": fmt}


def handle(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results of the jobs (the JSON list described above)."""
    tokenizers: dict[str, Any] = {}
    out = []
    for job in jobs:
        path = job["tokenizer"]
        if path not in tokenizers:
            tokenizers[path] = AutoTokenizer.from_pretrained(path)
        tok = tokenizers[path]
        fmt = _detect_content_format(job["template"], default="string")
        try:
            out.append(render(tok, job, fmt))
        except Exception as e:  # vLLM answers these with a 400
            out.append({"error": f"{type(e).__name__}: {e}", "format": fmt})
    return out


def main() -> None:
    logging.disable(logging.WARNING)
    json.dump(handle(json.load(sys.stdin)), sys.stdout)


if __name__ == "__main__":
    main()
