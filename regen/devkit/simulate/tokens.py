"""The simulator's "tokens": a deterministic word-piece count, no tokenizer needed.

A token is one match of :data:`PIECE`: optional leading whitespace, then either a run of 1-4
ASCII letters, or a single other non-space character (a digit, a punctuation mark, any non-ASCII
character). So ``" simulated."`` is 4 tokens: ``" simu"``, ``"late"``, ``"d"``, ``"."``.
Trailing whitespace is not a token. The simulator generates its answers from such pieces, so
``count_tokens(answer text)`` equals the number of pieces it generated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

#: one simulated token
PIECE = re.compile(r"\s*(?:[A-Za-z]{1,4}|\S)")

#: framing cost of one chat message (role marker, name, end marker), like a real template
MESSAGE_OVERHEAD = 3
#: the generation prompt (`<|im_assistant|>assistant<|im_middle|>`)
GENERATION_PROMPT = 3


def count_tokens(text: str) -> int:
    """Number of simulated tokens in ``text``."""
    if not text:
        return 0
    return sum(1 for _ in PIECE.finditer(text))


def split_pieces(text: str) -> list[str]:
    """``text`` as its simulated tokens (whitespace-only tails are dropped)."""
    return PIECE.findall(text)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(
            str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content
        )
    return str(content)


def prompt_tokens(messages: Iterable[Mapping[str, Any]], tools: list[Any] | None) -> int:
    """Simulated prompt length: every message's text plus framing, tool declarations, and the
    generation prompt."""
    n = GENERATION_PROMPT
    if tools:
        n += MESSAGE_OVERHEAD + count_tokens(json.dumps(tools, separators=(",", ":")))
    for m in messages:
        n += MESSAGE_OVERHEAD + count_tokens(_content_text(m.get("content")))
        n += count_tokens(_content_text(m.get("reasoning_content")))
        for call in m.get("tool_calls") or ():
            fn = call.get("function") or {}
            args = fn.get("arguments")
            n += (
                4
                + count_tokens(str(fn.get("name", "")))
                + count_tokens(args if isinstance(args, str) else json.dumps(args))
            )
    return n
