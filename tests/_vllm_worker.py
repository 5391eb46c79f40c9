"""One long-lived process of the vLLM environment's Python (``.venv-vllm``) that runs the tests'
vLLM-side helper scripts in turn, so that vLLM is imported once per test process and not once per
script launch: executed by that Python, never imported by the tests (``_vllm_call.vllm_call``
starts it).

The protocol, one JSON object a line (UTF-8; ASCII in practice):

- in, on stdin: ``{"script": "/abs/path/helper.py", "job": <any JSON>}`` and optionally
  ``"env": {"NAME": "value" | null}`` (set or unset for that job only; restored after it);
- out, on stdout: ``{"result": handle(job)}`` or ``{"error": "<traceback text>"}``, flushed.

A helper is imported once by its path (its folder first on ``sys.path``, as when run as a
script) and its ``handle(job)`` called per request. The worker exits at EOF on stdin.

Nothing else reaches the real stdout: at start the protocol keeps a private copy of file
descriptor 1, and both descriptor 1 and ``sys.stdout`` are pointed at stderr, so a library's
``print``, its logging handlers (vLLM's logs to ``sys.stdout``) and C code all write there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO


def _protocol_out() -> BinaryIO:
    """The real stdout, kept for the reply lines; everything else written to stdout goes to
    stderr from here on."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


_MODULES: dict[str, ModuleType] = {}


def _helper(script: str) -> ModuleType:
    """The helper at ``script``, imported once."""
    module = _MODULES.get(script)
    if module is None:
        path = Path(script)
        folder = str(path.parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        name = f"_vllm_worker_job_{len(_MODULES)}_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None, script
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        _MODULES[script] = module
    return module


def _run(request: dict[str, Any]) -> Any:
    """One request's ``handle(job)``, its ``env`` set for the call only."""
    changes: dict[str, str | None] = request.get("env") or {}
    saved = {name: os.environ.get(name) for name in changes}
    try:
        for name, value in changes.items():
            _set(name, value)
        return _helper(request["script"]).handle(request["job"])
    finally:
        for name, value in saved.items():
            _set(name, value)


def _set(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def main() -> None:
    out = _protocol_out()
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            reply: dict[str, Any] = {"result": _run(json.loads(line))}
            text = json.dumps(reply, default=str)
        except Exception:
            text = json.dumps({"error": traceback.format_exc()})
        finally:
            sys.stderr.flush()
        out.write(text.encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
