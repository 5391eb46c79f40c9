"""Serving the trained draft: the SGLang command, and checking a running server really uses it.

A vLLM server is checked by :mod:`regen.serve.vllm` (:func:`verify_any` picks by the
engine the server is: SGLang's ``/server_info``, vLLM's ``/version`` and ``vllm:`` metrics).

``serve_argv`` builds the ``python -m sglang.launch_server`` argv for the Kimi target with the
EAGLE-3 draft (``--speculative-algorithm EAGLE3`` and all three tuning flags). ``verify_server``
reads ``/server_info`` (fallback ``/get_server_info``) and refuses, with a TrapError, a server
that does not run exactly EAGLE3 with that draft; the URL may be the server's root or its
OpenAI base (``http://host:30000/v1``, the form ``--endpoint`` takes). An
``avg_spec_accept_length`` at or below ``LOW_ACCEPT_LENGTH`` passes with a warning: the draft
runs but is not helping. Reads ``DRAFT_DIR/config.json`` when present;
owns no files.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from regen.client.server_info import fetch_server_info
from regen.core import jsontext
from regen.core.errors import ConfigError, TrapError
from regen.serve import vllm as vllm_serving
from regen.targets import Family
from regen.train import traps
from regen.train.config import ServingSpec
from regen.train.traps import LOW_ACCEPT_LENGTH

log = logging.getLogger(__name__)


def serve_argv(
    draft_dir: str,
    *,
    target: str,
    serving: ServingSpec | None = None,
    host: str = "0.0.0.0",
    port: int = 30000,
    family: Family | None = None,
    trust_remote_code: bool = False,
) -> list[str]:
    """The SGLang command that serves ``target`` with the EAGLE-3 draft in ``draft_dir``;
    ``family``: the target's (its parser flags; None: none)."""
    s = serving or ServingSpec()
    traps.check_algorithm(s.speculative_algorithm, "serving.speculative_algorithm")
    argv = ["python", "-m", "sglang.launch_server", "--model-path", target, "--tp", str(s.tp)]
    if trust_remote_code:
        argv.append("--trust-remote-code")
    if family is not None:
        argv += family.sglang_flags()
    argv += [
        "--speculative-algorithm",
        s.speculative_algorithm,
        "--speculative-draft-model-path",
        draft_dir,
    ]
    if s.num_steps is not None:
        argv += [
            "--speculative-num-steps",
            str(s.num_steps),
            "--speculative-eagle-topk",
            str(s.eagle_topk),
            "--speculative-num-draft-tokens",
            str(s.num_draft_tokens),
        ]
    argv += ["--host", host, "--port", str(port)]
    return argv


def check_draft_dir(draft_dir: str, *, target_hidden: int | None, num_layers: int | None) -> None:
    """When DRAFT_DIR/config.json is readable: hidden size and aux ids (SpecForge numbering)."""
    try:
        cfg = json.loads((Path(draft_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if target_hidden is not None and "hidden_size" in cfg:
        traps.check_draft_hidden(int(cfg["hidden_size"]), target_hidden)
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids and num_layers is not None:
        traps.check_aux_layer_ids(ids, "specforge", num_layers)
    if ids:
        traps.check_aux_shift(ids)


def _same_path(a: str, b: str) -> bool:
    if os.path.normpath(a) == os.path.normpath(b):
        return True
    return os.path.realpath(a) == os.path.realpath(b)


@dataclass(slots=True)
class ServerCheck:
    """What verify_server found on a server that passed."""

    url: str
    algorithm: str
    draft_path: str
    #: the speculative settings as the server reported them (None: not reported)
    num_steps: object = None
    eagle_topk: object = None
    num_draft_tokens: object = None
    accept_lengths: list[float] = field(default_factory=list)

    @property
    def avg_accept_length(self) -> float | None:
        if not self.accept_lengths:
            return None
        return sum(self.accept_lengths) / len(self.accept_lengths)

    @property
    def draft_not_helping(self) -> bool:
        """True when the reported acceptance length is at or below ``LOW_ACCEPT_LENGTH``."""
        avg = self.avg_accept_length
        return avg is not None and avg <= LOW_ACCEPT_LENGTH


def accept_lengths(info: Mapping[str, object]) -> list[float]:
    """``internal_states[i].avg_spec_accept_length`` of a /server_info answer, where reported."""
    return [
        float(s["avg_spec_accept_length"])
        for s in jsontext.iterate(info.get("internal_states") or [])
        if isinstance(s, dict) and s.get("avg_spec_accept_length") is not None
    ]


def verify_server(
    url: str, draft_dir: str, *, timeout: float = 10.0, api_key: str | None = None
) -> ServerCheck:
    """Refuse a server not running exactly EAGLE3 with ``draft_dir`` as its draft."""
    if not draft_dir:
        raise ConfigError("--draft is required", field="draft")
    info = fetch_server_info(url, timeout=timeout, api_key=api_key)
    return check_server_info(info, url, draft_dir)


def verify_any(
    url: str, draft_dir: str, *, timeout: float = 10.0, api_key: str | None = None
) -> ServerCheck | vllm_serving.VllmCheck:
    """:func:`verify_server` for SGLang, :func:`regen.serve.vllm.verify_vllm_server`
    for vLLM (a ServerCheck or a VllmCheck), by the engine the server is."""

    if not draft_dir:
        raise ConfigError("--draft is required", field="draft")
    found = vllm_serving.identify_server(url, api_key=api_key, timeout=timeout)
    if found.engine == "vllm":
        return vllm_serving.verify_vllm_server(
            url, draft_dir, timeout=timeout, api_key=api_key, version=found.version
        )
    return verify_server(url, draft_dir, timeout=timeout, api_key=api_key)


def check_server_info(info: Mapping[str, object], url: str, draft_dir: str | None) -> ServerCheck:
    """What :func:`verify_server` checks, on a /server_info answer already read: exactly EAGLE3
    (TrapError ``eagle-vs-eagle3``), and, when ``draft_dir`` is given, that draft
    (TrapError ``wrong-draft``)."""
    algo = info.get("speculative_algorithm")
    traps.check_algorithm(None if algo is None else str(algo), f"{url} speculative_algorithm")
    served = info.get("speculative_draft_model_path")
    if draft_dir is not None and (not served or not _same_path(str(served), draft_dir)):
        raise TrapError(
            traps.TRAP_WRONG_DRAFT,
            f"{url} serves draft {served!r}, not {draft_dir!r}.",
            f"restart the server with --speculative-draft-model-path {draft_dir}.",
        )
    accepts = accept_lengths(info)
    check = ServerCheck(
        url=url,
        algorithm=str(algo),
        draft_path="" if served is None else str(served),
        num_steps=info.get("speculative_num_steps"),
        eagle_topk=info.get("speculative_eagle_topk"),
        num_draft_tokens=info.get("speculative_num_draft_tokens"),
        accept_lengths=accepts,
    )
    if check.draft_not_helping:
        log.warning("%s: avg_spec_accept_length %.3f <= %.1f: the draft is not helping",
                    url, check.avg_accept_length, LOW_ACCEPT_LENGTH)  # fmt: skip
    return check
