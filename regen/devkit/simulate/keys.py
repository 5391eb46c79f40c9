"""Stable keys of requests: what fault attempts and per-request stats are counted by.

``request_key`` identifies one request body (same messages, tools, sampling and limits → same
key, so a retry has the same key). ``conversation_key`` identifies the conversation a request
belongs to (tools + messages up to the first user message), so every turn of one sample shares
it. Both are short hex digests; tests compute them with these same functions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from regen.devkit.simulate.answer import requested_max_tokens, thinking_enabled

_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "model")


def _digest(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def request_key(request: Mapping[str, Any]) -> str:
    """Key of one request body (ignores stream options and token-id switches)."""
    return _digest(
        {
            "messages": request.get("messages"),
            "tools": request.get("tools") or None,
            "thinking": thinking_enabled(request),
            "max_tokens": requested_max_tokens(request),
            **{k: request.get(k) for k in _SAMPLING},
        }
    )


def conversation_key(request: Mapping[str, Any]) -> str:
    """Key shared by every turn of one conversation: tools + messages through the first user
    message."""
    head = []
    for m in request.get("messages") or ():
        head.append(m)
        if isinstance(m, Mapping) and m.get("role") == "user":
            break
    return _digest({"messages": head, "tools": request.get("tools") or None})
