"""A non-streamed answer (``"stream": false``) as SGLang (or vLLM) sends it, once the scheduler
made its tokens: the whole ``ChatCompletionResponse``, or what a fault makes of it half-way (a
cut connection, a 503 retraction, a graceful abort). SGLang's ``sglext`` object is built here
for both kinds of answer. Owns no files.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from regen.devkit.simulate.answer import SimAnswer
from regen.devkit.simulate.faults import Fault
from regen.devkit.simulate.replies import IM_END_ID, JSON, RETRACTED, drop, dumps, partial
from regen.devkit.simulate.scheduler import Job
from regen.devkit.simulate.state import SimState
from regen.devkit.simulate.tokenized import TokenIds


async def until(state: SimState, job: Job, tokens: int) -> None:
    """Wait until ``job`` made ``tokens`` tokens and the server is not hung."""
    while job.produced < tokens and not job.done:
        await job.progress()
    await state.hang.wait_resumed()


async def complete(
    state: SimState,
    request: web.Request,
    body: Mapping[str, Any],
    ans: SimAnswer,
    ids: TokenIds | None,
    job: Job,
    fault: Fault | None,
    usage: dict[str, Any],
    done: Callable[[], None],
) -> web.StreamResponse:
    """The answer once its tokens are made (``done`` counts it, just before it is sent)."""
    if fault in (Fault.DISCONNECT, Fault.RETRACT, Fault.ABORT):
        return await _cut_short(state, request, ans, job, fault, usage)
    await until(state, job, job.total)
    if fault is Fault.STALL:
        await asyncio.sleep(state.config.faults.stall_s)
        await state.hang.wait_resumed()
    out = whole(state, _message(state, body, ans), ans.finish_reason,
                IM_END_ID if ans.finish_reason == "stop" else None, usage)  # fmt: skip
    choice = out["choices"][0]
    want_prompt, want_output = state.dialect.asks_ids(body, False)
    if ids is not None and state.dialect.vllm_ids:  # vLLM: prompt at the top level
        if want_output:
            out["prompt_token_ids"] = ids.prompt
            choice["token_ids"] = ids.output
    elif ids is not None:  # SGLang puts both lists on the choice
        if want_prompt:
            choice["prompt_token_ids"] = ids.prompt
        if want_output:
            choice["response_token_ids"] = ids.output
    ext = sglext(state, body, job, None, usage)  # non-streamed: ids stay on the choice
    if ext:
        out["sglext"] = ext
    done()
    return web.Response(body=dumps(out), content_type=JSON)


async def _cut_short(
    state: SimState,
    request: web.Request,
    ans: SimAnswer,
    job: Job,
    fault: Fault,
    usage: dict[str, Any],
) -> web.StreamResponse:
    """Half-way through the answer: the connection cut, a 503 (SGLang: HTTPException once the
    request is aborted), or a graceful abort (HTTP 200, what was made, ``abort``)."""
    await until(state, job, job.total // 2)
    job.cancelled = True
    if fault is Fault.DISCONNECT:
        return await cut(request, b'{"id":"chatcmpl-cut","object":"chat.completion",')
    if fault is Fault.RETRACT:
        return state.error(503, RETRACTED, "503")
    reasoning, content = partial(ans, job.total // 2)
    message = {"role": "assistant", "content": content,
               state.dialect.reasoning_key: reasoning or None}  # fmt: skip
    return web.Response(body=dumps(whole(state, message, "abort", None, usage)),
                        content_type=JSON)  # fmt: skip


def _message(state: SimState, body: Mapping[str, Any], ans: SimAnswer) -> dict[str, Any]:
    """SGLang's ChatMessage: content is "" (never null) when empty; tool_calls is left out
    when there are none; reasoning_content is null when empty."""
    key = state.dialect.reasoning_key
    message: dict[str, Any] = {
        "role": "assistant",
        "content": ans.content or (None if state.dialect.null_empty_content else ""),
        key: ans.reasoning or None,
    }
    if ans.tool_calls:
        message["tool_calls"] = [c.as_openai(i) for i, c in enumerate(ans.tool_calls)]
    if not body.get("separate_reasoning", True) and ans.reasoning:
        message["content"] = f"{ans.reasoning}</think>{ans.content}"
        message[key] = None
    return message


def whole(
    state: SimState,
    message: dict[str, Any],
    finish: str,
    matched: int | None,
    usage: dict[str, Any],
) -> dict[str, Any]:
    """A non-streamed ``ChatCompletionResponse`` as SGLang serializes it."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": finish,
        "matched_stop": matched,
    }
    return {
        "id": f"chatcmpl-{os.urandom(8).hex()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": state.config.model_name,
        "choices": [choice],
        "usage": usage,
        "metadata": None,
    }


def sglext(
    state: SimState,
    body: Mapping[str, Any],
    job: Job,
    ids: TokenIds | None,
    usage: dict[str, Any],
) -> dict[str, Any]:
    """SGLang's extension object: the request's spec_tokens_details when asked (on a
    speculative server, once it had a verify step), and, for streams, the ids asked with
    return_{input,output}_ids_in_sglext (``ids``). vLLM has none."""
    ext: dict[str, Any] = {}
    if not state.dialect.sglext:
        return ext
    asked = body.get("return_spec_tokens_details") and state.config.spec_tokens_details
    if asked and state.spec is not None and job.spec is not None:
        details = state.spec.details(job.spec, usage["completion_tokens"])
        if details is not None:
            ext["spec_tokens_details"] = details
    if ids is not None:
        if body.get("return_input_ids_in_sglext"):
            ext["input_ids"] = ids.prompt
        if body.get("return_output_ids_in_sglext"):
            ext["output_ids"] = [ids.output]  # one list per choice
    return ext


async def cut(request: web.Request, sent: bytes) -> web.StreamResponse:
    """Send ``sent`` then drop the connection (an answer cut mid-way)."""
    resp = web.StreamResponse(headers={"Content-Type": JSON})
    resp.content_length = len(sent) + 4096  # promise more than we send
    await resp.prepare(request)
    await resp.write(sent)
    drop(request)
    return resp
