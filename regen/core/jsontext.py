"""JSON text from outside (a source row, a tool call's arguments, a model's answer) decoded
without surprises. Owns no files.

``json.loads`` raises ``RecursionError``, not ``JSONDecodeError``, on text nested deeper than
the interpreter's recursion limit (``"[" * 100_000``): one such line would escape every
``except ValueError`` that guards a row and take the whole plan or run with it. :func:`loads`
and :func:`raw_decode` raise ``JSONDecodeError`` for it, like any other text that is not JSON.
"""

from __future__ import annotations

import json
from typing import Any

_DECODER = json.JSONDecoder()
#: the message of a text nested too deeply
TOO_DEEP = "nested too deeply"


def loads(text: str | bytes) -> Any:
    """``json.loads(text)``; ``JSONDecodeError`` for any text that is not JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        raise _too_deep(text, 0) from None


def raw_decode(text: str, pos: int = 0) -> tuple[Any, int]:
    """``JSONDecoder().raw_decode(text, pos)``, the same way."""
    try:
        return _DECODER.raw_decode(text, pos)
    except RecursionError:
        raise _too_deep(text, pos) from None


def _too_deep(text: str | bytes, pos: int) -> json.JSONDecodeError:
    doc = text if isinstance(text, str) else text.decode("utf-8", "replace")
    return json.JSONDecodeError(TOO_DEEP, doc, pos)
