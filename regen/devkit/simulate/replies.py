"""The pieces every answer of the simulated server is made of, as SGLang serializes them: JSON
bytes, the usage object, the partial answer of an aborted request, and the signals the
handlers pass each other (a refused request, a client that hung up). Owns no files.
"""

from __future__ import annotations

import functools
import json
from json.encoder import encode_basestring_ascii
from typing import Any

from aiohttp import web

from regen.devkit.simulate.answer import SimAnswer
from regen.devkit.simulate.tokenized import TokenIds

#: `<|im_end|>` in the Kimi vocabulary: what SGLang reports as matched_stop
IM_END_ID = 163586

JSON = "application/json"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}

#: SGLang's message for a request retracted half-way (scheduler.py, schedule_batch.py)
RETRACTED = "Retracted under decode memory pressure without a KV backup. Retry later."

#: request-storage key: the HTTP status a request's response has sent (headers on the wire)
SENT = web.RequestKey("regen_sim_sent_status", int)


@functools.lru_cache(maxsize=1 << 16)
def text_json(text: str) -> bytes:
    """``text`` as a JSON string literal (cached: answers reuse a small set of pieces)."""
    return encode_basestring_ascii(text).encode()


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


class ClientGone(Exception):
    """The client hung up; ``response`` is the prepared response to hand back to aiohttp."""

    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response


class Invalid(Exception):
    """A request refused before it is answered; ``response`` is its error."""

    def __init__(self, response: web.Response) -> None:
        self.response = response


def usage(
    ans: SimAnswer, ids: TokenIds | None, n_prompt: int, cached: int | None = None
) -> dict[str, Any]:
    """The usage object; ``cached``: the prompt's cached tokens, reported in
    ``prompt_tokens_details`` (None: not reported, the engines' default)."""
    completion = len(ids.output) if ids else ans.completion_tokens
    reasoning = ids.reasoning_tokens if ids else ans.reasoning_tokens
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": completion,
        "total_tokens": n_prompt + completion,
        "reasoning_tokens": reasoning,
        "prompt_tokens_details": None if cached is None else {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


def zero_usage(n_prompt: int) -> dict[str, Any]:
    return {"prompt_tokens": n_prompt, "completion_tokens": 0, "total_tokens": n_prompt,
            "reasoning_tokens": 0, "prompt_tokens_details": None,
            "completion_tokens_details": None}  # fmt: skip


def partial(ans: SimAnswer, n: int) -> tuple[str, str]:
    """Reasoning and content of the first ``n`` tokens of an answer."""
    nr = len(ans.reasoning_pieces)
    return "".join(ans.reasoning_pieces[:n]), "".join(ans.content_pieces[: max(0, n - nr)])


def drop(request: web.Request) -> None:
    """Drop the connection under ``request`` (a stream cut mid-way)."""
    transport = request.transport
    if transport is not None:
        transport.abort()
