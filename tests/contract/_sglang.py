"""Load single modules of the installed SGLang wheel on CPU, without its package ``__init__``.

``import sglang`` runs a chain that pulls in torch, triton, FlashInfer and more. The contract
tests need only a few pure-Python files (the OpenAI protocol models, the Kimi reasoning and
tool-call detectors). :func:`load` registers empty parent packages (``sglang``,
``sglang.srt``, ...) whose ``__path__`` points into the installed wheel, then imports the
module the normal way: its own imports resolve inside the wheel through those empty parents,
so only the files it really needs run. ``sglang.utils`` (IPython, requests, numpy for notebook
helpers) is replaced by a module holding the one function ``protocol.py`` takes from it.

The wheel must be exactly :data:`SGLANG_VERSION`: :func:`check_version` fails loudly
otherwise (the facts these tests pin were read in that version's code).
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

#: the SGLang release whose code these tests were written against (scripts/bootstrap pins it)
SGLANG_VERSION = "0.5.23"


@functools.cache
def wheel_root() -> Path:
    """Folder of the installed ``sglang`` package (found without importing it)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(
            f"sglang=={SGLANG_VERSION} is not installed: run scripts/bootstrap "
            "(it installs the wheel with --no-deps for these contract tests)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def check_version() -> str:
    """The installed version; a test failure naming both versions when it is not the pin."""
    installed = importlib.metadata.version("sglang")
    recorded = (wheel_root() / "_version.py").read_text(encoding="utf-8")
    if installed != SGLANG_VERSION or f"'{SGLANG_VERSION}'" not in recorded:
        pytest.fail(
            f"the contract tests pin sglang=={SGLANG_VERSION} but sglang=={installed} is "
            "installed: re-read the wheel's code (CONTRACTS.md §2b) before moving the pin"
        )
    return installed


def _convert_json_schema_to_str(json_schema: Any) -> str:
    """``sglang.utils.convert_json_schema_to_str`` for dicts and strings (what regen sends)."""
    return json_schema if isinstance(json_schema, str) else json.dumps(json_schema)


def _ensure_parents(name: str, root: Path) -> None:
    parts = name.split(".")
    for i in range(1, len(parts)):
        pkg = ".".join(parts[:i])
        if pkg in sys.modules:
            continue
        path = str(root.parent.joinpath(*parts[:i]))
        mod = types.ModuleType(pkg)
        mod.__spec__ = importlib.machinery.ModuleSpec(pkg, None, is_package=True)
        mod.__spec__.submodule_search_locations = [path]
        mod.__path__ = [path]
        mod.__package__ = pkg
        sys.modules[pkg] = mod
    if "sglang.utils" not in sys.modules:
        utils = types.ModuleType("sglang.utils")
        utils.convert_json_schema_to_str = _convert_json_schema_to_str  # type: ignore[attr-defined]
        sys.modules["sglang.utils"] = utils


def load(name: str) -> types.ModuleType:
    """Import ``name`` (e.g. ``sglang.srt.entrypoints.openai.protocol``) from the wheel."""
    check_version()
    root = wheel_root()
    loaded = sys.modules.get("sglang")
    if loaded is not None and getattr(loaded, "__file__", None):
        pytest.fail("the real sglang package is imported in this process; cannot stub it")
    _ensure_parents(name, root)
    module = importlib.import_module(name)
    assert module.__file__ is not None and Path(module.__file__).is_relative_to(root)
    return module
