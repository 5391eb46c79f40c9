"""Tool calls that do not fit the tools the request declared.

A call is bad when its function is not among the declared ones, its arguments are not JSON,
are not a JSON object, miss a ``required`` parameter, carry a parameter the declaration forbids
(``additionalProperties: false``), or give a declared parameter a value of the wrong JSON type
(only the JSON Schema type names are checked: ``string``, ``number``, ``integer``, ``boolean``,
``array``, ``object``, ``null``, or a list of them; anything else in a declaration is trusted).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def declared(tools: Sequence[Mapping[str, object]] | None) -> dict[str, Mapping[str, object]]:
    """Function name → its ``parameters`` schema (``{}`` when none) of OpenAI tool declarations."""
    out: dict[str, Mapping[str, object]] = {}
    for t in tools or ():
        fn = t.get("function") if isinstance(t, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, Mapping) else {}
    return out


def call_problem(
    call: Mapping[str, object], tools: Mapping[str, Mapping[str, object]]
) -> str | None:
    """Why an OpenAI-shape tool call does not fit ``tools`` (from :func:`declared`), or None.
    With no tools declared at all (a request without declarations; history calls), only the
    arguments' JSON is checked."""
    nested = call.get("function")
    fn = nested if isinstance(nested, Mapping) else call
    name = fn.get("name")
    if tools and name not in tools:
        return f"undeclared function {name!r}"
    raw = fn.get("arguments")
    args: object
    if isinstance(raw, str):
        try:
            args = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return "arguments are not JSON"
    else:
        args = raw if raw is not None else {}
    if not isinstance(args, dict):
        return "arguments are not a JSON object"
    schema = tools.get(name, {}) if isinstance(name, str) else {}
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    required = schema.get("required")
    required = required if isinstance(required, list) else []
    missing = [k for k in required if isinstance(k, str) and k not in args]
    if missing:
        return f"missing required {missing[0]!r}"
    if schema.get("additionalProperties") is False:
        extra = [k for k in args if k not in props]
        if extra:
            return f"undeclared parameter {extra[0]!r}"
    for key, value in args.items():
        spec = props.get(key)
        if isinstance(spec, Mapping) and not _type_fits(value, spec.get("type")):
            return f"parameter {key!r} is not of type {spec.get('type')}"
    return None


def _type_fits(value: object, kind: object) -> bool:
    kinds = kind if isinstance(kind, list) else [kind]
    known = [k for k in kinds if isinstance(k, str) and k in _TYPES]
    if not known:
        return True  # no type, or not a JSON Schema type name: trusted
    for k in known:
        if isinstance(value, bool) and k in ("number", "integer"):
            continue  # JSON true is not a number
        if k == "integer" and isinstance(value, float) and value.is_integer():
            return True
        if isinstance(value, _TYPES[k]):
            return True
    return False
