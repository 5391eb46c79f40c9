"""The loop's vLLM servers: the target alone, and the target speculating with a draft, which is
checked before any process starts.

:func:`speculative_server` refuses (:class:`regen.core.errors.TrapError`) a draft vLLM would serve
wrong, before it builds the server: a method other than exactly ``eagle3`` (EAGLE-1 drafting
feeds an EAGLE-3 draft no aux hidden states) and a draft whose config gives vLLM other aux
layers than it was trained on (a SpecForge export served as is, or a copy edited since
``regen serve-command --engine vllm`` wrote it): the checks of
:mod:`regen.serve.vllm`, the ones ``regen verify-server`` makes of a running server.
Server processes: :class:`regen.devkit.servers.vllm.VllmServer`.
"""

from __future__ import annotations

import os
from pathlib import Path

from regen.core.errors import ConfigError
from regen.devkit.servers.vllm import VllmServer
from regen.serve.vllm import VLLM_EAGLE3, check_method, check_vllm_draft, speculative_config
from regen.targets import Family

#: sequences each server runs at once (the bench's highest level should not exceed it)
MAX_NUM_SEQS = 8


def vllm_python(venv: str | Path | None = None) -> Path:
    """The Python of vLLM's own environment (``scripts/vllm-env``): ``venv``, else
    ``$REGEN_VLLM_VENV``, else ``.venv-vllm``; ConfigError when it is not installed."""
    root = Path(venv or os.environ.get("REGEN_VLLM_VENV") or ".venv-vllm")
    py = root / "bin" / "python"
    failed = root / ".install-failed"
    if failed.exists():
        why = failed.read_text(encoding="utf-8", errors="replace").strip()
        raise ConfigError(f"the vLLM environment {root} failed to install: {why}", field="vllm")
    if not py.exists():
        raise ConfigError(
            f"no vLLM environment at {root}: run `bash scripts/vllm-env` first (or pass "
            "--vllm-venv)",
            field="vllm",
        )
    return py


def target_server(
    python: Path, model_dir: Path, *, served_name: str, log_path: Path, family: Family | None
) -> VllmServer:
    """vLLM serving the target alone (regeneration, and the bench's baseline), with its
    family's flags."""
    return VllmServer(python, model_dir, served_name=served_name, max_num_seqs=MAX_NUM_SEQS,
                      log_path=log_path, family=family)  # fmt: skip


def speculative_server(
    python: Path,
    model_dir: Path,
    draft_dir: Path,
    *,
    served_name: str,
    num_speculative_tokens: int,
    log_path: Path,
    family: Family | None,
    method: str = VLLM_EAGLE3,
) -> VllmServer:
    """vLLM serving the target with the draft in ``draft_dir`` (its vLLM copy), refused before
    the server exists when vLLM would serve it wrong (module docstring)."""
    check_method(method, "the speculative config's method")
    check_vllm_draft(draft_dir)
    spec = {**speculative_config(str(draft_dir), num_speculative_tokens), "method": method}
    return VllmServer(python, model_dir, served_name=served_name, max_num_seqs=MAX_NUM_SEQS,
                      speculative_config=spec, log_path=log_path, family=family)  # fmt: skip
