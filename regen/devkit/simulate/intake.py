"""One chat request as the simulated server takes it in: its body read and validated (SGLang's
400s and 404s, or vLLM's), and its answer prepared: the prompt's tokens (from the tokenizer, or
counted), the context check, the fault drawn, the deterministic answer and, with a tokenizer,
its ids. Owns no files.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from regen.core.errors import ArgumentsError
from regen.devkit.simulate.answer import SimAnswer, answer, requested_max_tokens, thinking_enabled
from regen.devkit.simulate.faults import Fault
from regen.devkit.simulate.prefix_cache import Segment, message_segments, token_segments
from regen.devkit.simulate.replies import Invalid
from regen.devkit.simulate.state import SimState
from regen.devkit.simulate.tokenized import TokenIds
from regen.devkit.simulate.tokens import prompt_tokens as sim_prompt_tokens
from regen.template.prepare import parse_arguments


@dataclass(slots=True)
class Prepared:
    """A request's answer before it is scheduled."""

    ans: SimAnswer
    ids: TokenIds | None  #: prompt and answer ids (with --tokenizer)
    fault: Fault | None  #: the fault drawn for this attempt
    segments: list[Segment] | None  #: the prompt's prefix-cache segments (None: no cache)

    @property
    def n_prompt(self) -> int:
        return len(self.ids.prompt) if self.ids else self.ans.prompt_tokens


async def read_request(state: SimState, request: web.Request) -> tuple[dict[str, Any], bool]:
    """The request's body, validated, and whether it streams (:class:`Invalid`: its 400)."""
    raw = await request.read()
    try:
        body = json.loads(raw)
    except ValueError:
        raise Invalid(
            state.error(400, "request body is not valid JSON", "BadRequestError")
        ) from None
    validate(state, body)
    stream = bool(body.get("stream"))
    want_prompt_ids = bool(body.get("return_prompt_token_ids"))
    want_ids = bool(body.get("return_token_ids"))
    if state.dialect.vllm_ids:  # return_token_ids streams too; needs ids
        want_prompt_ids, want_ids = state.dialect.asks_ids(body, stream)
    elif (want_ids or want_prompt_ids) and stream:
        raise Invalid(
            state.error(
                400,
                "return_token_ids/return_prompt_token_ids are not supported with "
                "streaming. Please set stream=false.",
                "BadRequestError",
            )
        )
    if (want_ids or want_prompt_ids) and state.tokenizer is None:
        raise Invalid(
            state.error(
                400,
                "token ids need a tokenizer: start the simulator with --tokenizer DIR",
                "BadRequestError",
            )
        )
    return body, stream


def validate(state: SimState, body: Any) -> None:
    if not isinstance(body, dict):
        raise Invalid(state.error(400, "request body must be a JSON object", "BadRequestError"))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Invalid(state.error(400, "messages must be a non-empty list", "BadRequestError"))
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise Invalid(state.error(400, f"messages[{i}] needs a string role", "BadRequestError"))
    model = body.get("model")
    if model not in (state.config.model_name, state.model_path):
        raise Invalid(
            state.error(404, f"The model `{model}` does not exist.", "NotFoundError")
            if not state.dialect.model_404_aliases
            else state.error(
                404,
                f"The model `{model}` does not exist. Valid aliases: {state.config.model_name}.",
                "NotFoundError",
                "model",
            )
        )
    n = body.get("n")
    if n not in (None, 1):
        raise Invalid(state.error(400, "the simulator supports n=1 only", "BadRequestError"))
    if state.dialect.strict_arguments:
        check_history_arguments(state, messages)


def check_history_arguments(state: SimState, messages: list[dict[str, Any]]) -> None:
    """SGLang's 400 for a history tool call whose arguments are not a JSON object
    (``serving_chat.py`` ``normalize_assistant_tool_call_arguments``, strict)."""
    for m in messages:
        if m.get("role") != "assistant" or not isinstance(m.get("tool_calls"), list):
            continue
        for call in m["tool_calls"]:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                try:
                    parse_arguments(fn["arguments"], "refuse")
                except ArgumentsError as e:
                    message = str(e).split(" (tool call", 1)[0]
                    raise Invalid(state.error(400, message, "BadRequest")) from None


def context_check(state: SimState, n_prompt: int, max_tokens: int | None) -> None:
    ctx = state.config.context_length
    if n_prompt >= ctx:
        msg, param = state.dialect.long_prompt_error(n_prompt, ctx)
        raise Invalid(state.error(400, msg, "BadRequestError", param))
    if max_tokens is not None and n_prompt + max_tokens > ctx:
        msg = (
            f"Requested token count exceeds the model's maximum context length of {ctx} "
            f"tokens. You requested a total of {n_prompt + max_tokens} tokens: {n_prompt} "
            f"tokens from the input messages and {max_tokens} tokens for the completion. "
            "Please reduce the number of tokens in the input messages or the completion to "
            "fit within the limit."
        )
        raise Invalid(state.error(400, msg, "BadRequestError"))


async def prepare(state: SimState, body: dict[str, Any], key: str, attempt: int) -> Prepared:
    """The request's answer: its prompt counted (or tokenized), checked against the context,
    the fault of this attempt drawn (:class:`Invalid`: a 400)."""
    messages = body["messages"]
    tools = body.get("tools") or None
    tok = state.tokenizer
    cache = state.cache
    salt = body.get("cache_salt")
    salt = salt if isinstance(salt, str) and salt else None
    segments: list[Segment] | None = None
    if tok is not None:
        prompt_text = await asyncio.to_thread(tok.render_prompt, body)
        prompt_ids = tok.encode(prompt_text)
        n_prompt = len(prompt_ids)
        if cache is not None:
            segments = token_segments(prompt_ids, cache.block_size, salt)
    elif cache is not None:  # its tokens add up to the prompt's count
        segments = message_segments(messages, tools, salt)
        n_prompt = sum(t for _, t in segments)
    else:
        n_prompt = sim_prompt_tokens(messages, tools)
    max_tokens = requested_max_tokens(body)
    if max_tokens is not None and max_tokens < 0:
        raise Invalid(state.error(400, "max_tokens must be >= 0", "BadRequestError"))
    context_check(state, n_prompt, max_tokens)
    fault = state.config.faults.decide(key, attempt)
    ans = answer(
        body,
        state.config.answer,
        default_max_tokens=state.config.context_length - n_prompt,
        prompt_tokens=n_prompt,
    )
    ids: TokenIds | None = None
    if tok is not None:
        ids = tok.token_ids(prompt_text, prompt_ids, ans, thinking_enabled(body))
    return Prepared(ans, ids, fault, segments)
