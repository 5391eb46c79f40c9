"""JSON text from outside (a source row, a tool call's arguments, a model's answer) decoded
without surprises. Owns no files.

``json.loads`` raises ``RecursionError``, not ``JSONDecodeError``, on text nested deeper than
the interpreter's recursion limit (``"[" * 100_000``): one such line would escape every
``except ValueError`` that guards a row and take the whole plan or run with it. :func:`loads`
and :func:`raw_decode` raise ``JSONDecodeError`` for it, like any other text that is not JSON.

What they return is a :data:`JsonValue`: the one type of decoded JSON in regen (narrow it with
``isinstance`` before use; :func:`iterate` loops over a value as ``for`` does).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TypeAlias

#: a JSON value as ``json.loads`` returns it
JsonValue: TypeAlias = "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
#: a JSON object as ``json.loads`` returns it
JsonObject: TypeAlias = "dict[str, JsonValue]"

_DECODER = json.JSONDecoder()
#: the message of a text nested too deeply
TOO_DEEP = "nested too deeply"


def loads(text: str | bytes) -> JsonValue:
    """``json.loads(text)``; ``JSONDecodeError`` for any text that is not JSON."""
    try:
        value: JsonValue = json.loads(text)
        return value
    except RecursionError:
        raise _too_deep(text, 0) from None


def raw_decode(text: str, pos: int = 0) -> tuple[JsonValue, int]:
    """``JSONDecoder().raw_decode(text, pos)``, the same way."""
    try:
        value: JsonValue
        value, end = _DECODER.raw_decode(text, pos)
        return value, end
    except RecursionError:
        raise _too_deep(text, pos) from None


def iterate(value: object) -> Iterable[object]:
    """``value`` to loop over, as ``for item in value`` takes it: TypeError (Python's own
    message) for a value that is not iterable."""
    if isinstance(value, Iterable):
        return value
    raise TypeError(f"'{type(value).__name__}' object is not iterable")


def _too_deep(text: str | bytes, pos: int) -> json.JSONDecodeError:
    doc = text if isinstance(text, str) else text.decode("utf-8", "replace")
    return json.JSONDecodeError(TOO_DEEP, doc, pos)
