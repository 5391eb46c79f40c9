"""Tool declarations as the serving engines reshape them before the chat template renders them.

Owns no files. A request's ``tools`` reach a template through each engine's protocol model,
not as the client sent them; a template that prints them (``tools | tojson``) shows the shape:

- vLLM 0.32 (``ChatCompletionToolsParam`` / ``FunctionDefinition``, ``model_dump()``):
  ``{"type", "function": {"name", "description", "parameters"}}`` in that order, a missing
  description or parameters as None, ``strict`` / ``defer_loading`` only where set, unknown
  keys dropped (:func:`vllm_tools`);
- SGLang 0.5.23 (``protocol.py`` ``Tool`` / ``Function``, ``model_dump()``): the function's
  keys in the client's order, a missing description or parameters appended as None, unknown
  keys dropped, and the wrapper's ``defer_loading`` always there (None when unset); its
  parameter schema's non-standard type names rewritten first (``function_call/utils.py``
  ``normalize_json_schema_types``: ``int`` -> ``integer``, ``varchar(255)`` -> ``string``, ...;
  :func:`schema_types`) (:func:`sglang_tools`).

regen.template.prepare hands the template these; the families whose engines encode prompts in
Python (regen.targets) start from them too.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

#: the fields of a function declaration the engines' models keep
_FUNCTION_KEYS = ("name", "description", "parameters", "strict", "defer_loading")
_OPTIONAL = ("strict", "defer_loading")


def vllm_tools(tools: Sequence[Mapping[str, object]] | None) -> list[dict[str, object]] | None:
    """The tools as vLLM's ``model_dump()`` gives them (None: none)."""
    if not tools:
        return None
    out = []
    for t in tools:
        fn = _function(t)
        spec = {k: fn.get(k) for k in ("name", "description", "parameters")}
        spec.update({k: fn[k] for k in _OPTIONAL if fn.get(k) is not None})
        tool: dict[str, object] = {"type": t.get("type", "function"), "function": spec}
        if t.get("defer_loading") is not None:
            tool["defer_loading"] = t["defer_loading"]
        out.append(tool)
    return out


def sglang_tools(tools: Sequence[Mapping[str, object]] | None) -> list[dict[str, object]] | None:
    """The tools as SGLang's ``model_dump()`` gives them (None: none)."""
    if not tools:
        return None
    out: list[dict[str, object]] = []
    for t in tools:
        fn = _function(t)
        spec = {k: v for k, v in fn.items()
                if k in _FUNCTION_KEYS and (k not in _OPTIONAL or v is not None)}  # fmt: skip
        for k in ("description", "parameters"):
            spec.setdefault(k, None)
        if spec.get("parameters") is not None:
            spec["parameters"] = copy.deepcopy(spec["parameters"])
            schema_types(spec["parameters"])
        defer = t.get("defer_loading")
        if defer is not None and spec.get("defer_loading") is None:
            spec["defer_loading"] = defer
        out.append({"type": t.get("type", "function"), "function": spec, "defer_loading": defer})
    return out


def _function(tool: Mapping[str, object]) -> Mapping[str, object]:
    """A tool's function declaration (none where it has no object: the sources' tools always
    have one, :func:`regen.sources.shapes.check_tools`)."""
    fn = tool.get("function")
    return fn if isinstance(fn, Mapping) else {}


# -- SGLang's JSON Schema type names (function_call/utils.py normalize_json_schema_types) ---
_STANDARD_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})
_TYPE_ALIASES = {
    **dict.fromkeys(("str", "text", "varchar", "char", "enum", "uuid", "date", "datetime", "time",
                     "timestamp", "binary", "blob", "bytea", "bytes", "varbinary"), "string"),
    "bool": "boolean",
    **dict.fromkeys(("bigint", "smallint", "tinyint"), "integer"),
    **dict.fromkeys(("double", "decimal", "real", "numeric"), "number"),
    **dict.fromkeys(("arr", "tuple", "set"), "array"),
    "map": "object",
}  # fmt: skip
_TYPE_PREFIXES = (
    (("int", "uint", "long", "short", "unsigned"), "integer"),
    (("num", "float"), "number"),
    (("list",), "array"),
    (("dict",), "object"),
)
_PREFIX_BOUNDARY = frozenset("0123456789[<( \t")
_NESTED_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_NESTED_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_NESTED = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
           "propertyNames", "unevaluatedItems", "unevaluatedProperties")  # fmt: skip


def schema_types(schema: object) -> None:
    """Rewrite, in place, a JSON Schema's non-standard ``type`` names to JSON Schema's own, as
    SGLang does before rendering (unknown names stay)."""
    if isinstance(schema, list):
        for item in schema:
            schema_types(item)
        return
    if not isinstance(schema, dict):
        return
    t = schema.get("type")
    if isinstance(t, str):
        schema["type"] = _standard_type(t)
    elif isinstance(t, list):
        schema["type"] = list(dict.fromkeys(_standard_type(x) for x in t))
    for key in _NESTED_MAPS:
        if isinstance(nested := schema.get(key), dict):
            for v in nested.values():
                schema_types(v)
    for key in _NESTED_LISTS:
        if isinstance(nested := schema.get(key), list):
            for v in nested:
                schema_types(v)
    for key in _NESTED:
        if key in schema:
            schema_types(schema[key])


def _standard_type(raw: object) -> object:
    if not isinstance(raw, str) or raw in _STANDARD_TYPES:
        return raw
    base = raw.split("(", 1)[0].strip().lower()
    if base in _STANDARD_TYPES:
        return base
    if base in _TYPE_ALIASES:
        return _TYPE_ALIASES[base]
    for prefixes, target in _TYPE_PREFIXES:
        if any(base == p or (base.startswith(p) and len(base) > len(p)
                             and base[len(p)] in _PREFIX_BOUNDARY) for p in prefixes):  # fmt: skip
            return target
    return raw
