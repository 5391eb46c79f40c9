"""``regen simulate``'s command-line flags, generated from :class:`SimConfig` (one spelling).

Each field of :class:`~regen.devkit.simulate.config.SimConfig` (and of its nested ``answer`` and
``faults`` models) becomes ``--field-name``: its description is the help text, its default is
shown from the model, booleans are switches and ``Literal`` fields get their choices. Flags the
user does not give stay out of the namespace, so the model's own defaults apply
(:func:`config_from_args`). Owns no files.
"""

from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from regen.devkit.simulate.answer import AnswerConfig
from regen.devkit.simulate.config import SimConfig
from regen.devkit.simulate.faults import FaultConfig

#: nested models whose fields are flags of their own group
NESTED: dict[str, tuple[type[BaseModel], str]] = {
    "answer": (AnswerConfig, "answers"),
    "faults": (FaultConfig, "faults"),
}


def _fields() -> list[tuple[str, FieldInfo, str]]:
    """(name, field, group) of every flag, in model order."""
    out = []
    for name, f in SimConfig.model_fields.items():
        if name in NESTED:
            model, group = NESTED[name]
            out += [(n, sub, group) for n, sub in model.model_fields.items()]
            continue
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        out.append((name, f, str(extra.get("group", "server"))))
    return out


def flag_names() -> frozenset[str]:
    """The namespace keys :func:`add_flags` may set."""
    return frozenset(name for name, _, _ in _fields())


def _scalar(annotation: Any) -> Any:
    """``int | None`` → int; ``Literal[...]`` stays; ``Path | None`` → Path."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return annotation


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add one flag per option, in groups (server, capacity model, answers, faults, ...)."""
    groups: dict[str, Any] = {}
    for name, f, group in _fields():
        g = groups.get(group) or groups.setdefault(group, parser.add_argument_group(group))
        flag = "--" + name.replace("_", "-")
        help_text = f.description or ""
        kind = _scalar(f.annotation)
        if kind is bool:  # a switch; one that is on by default is turned off with --no-NAME
            on = f.default is True
            action = argparse.BooleanOptionalAction if on else "store_true"
            g.add_argument(flag, action=action, default=argparse.SUPPRESS, help=help_text)
            continue
        kw: dict[str, Any] = {"default": argparse.SUPPRESS, "dest": name}
        if typing.get_origin(kind) is typing.Literal:
            kw["choices"] = list(typing.get_args(kind))
        elif kind in (int, float, Path):
            kw["type"] = kind
        if f.default not in (None, (), "") and name != "api_key":
            help_text += f" (default {f.default})"
        g.add_argument(flag, help=help_text, **kw)


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The SimConfig of parsed flags (other namespace keys, e.g. the command's, ignored)."""
    names = flag_names()
    return SimConfig.from_flat({k: v for k, v in vars(args).items() if k in names})
