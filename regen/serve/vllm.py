"""Serving the trained draft with vLLM: the command, the draft copy in vLLM's layer numbering,
and checking a running vLLM server (``verify-server``, ``bench``).

**The aux-layer numbering trap.** The draft's ``config.json`` carries the target layers its fc
fuses, ``eagle_aux_hidden_state_layer_ids``. SpecForge writes them in its training numbering:
id ``i`` is the output of decoder layer ``i`` (its capture hands the ids to SGLang's
``set_eagle3_layers_to_capture``, which adds 1 for Llama-family targets). vLLM 0.32 reads the
ids literally (``v1/worker/gpu_model_runner.py`` ``_get_eagle3_aux_layers_from_config``:
top-level ``eagle_aux_hidden_state_layer_ids``, else ``eagle_config``'s) as the index into
the hidden states with the embedding at 0: ``llama.py`` appends ``hidden_states + residual``
after layer ``idx`` under id ``idx + 1`` (``_maybe_add_hidden_state``), ``deepseek_v2.py``
(Kimi-K2.5 delegates to it) appends the input of layer ``idx`` under id ``idx``: both mean the
output of layer ``id - 1``. So a SpecForge-numbered draft served by vLLM captures every layer
one early, silently. :func:`write_vllm_draft` writes a copy whose ids are SpecForge's + 1
(``[1, 29, 57]`` → ``[2, 30, 58]`` for K2.5, what SGLang captures), the weights linked, with a
``regen_vllm_draft`` record of where it came from; :func:`check_vllm_draft` refuses to serve or
pass a draft that is not such a copy (a SpecForge export as is) or whose ids no longer are its
record's + 1.

**The EAGLE-vs-EAGLE3 trap.** ``--speculative-config``'s ``method`` must be exactly
``eagle3``: vLLM only then captures the aux hidden states (``use_aux_hidden_state_outputs``);
given ``eagle`` it never upgrades (``config/speculative.py`` auto-detects only when the method
is left out) and renames the architecture to ``Eagle{arch}``.

**What a vLLM server exposes.** Unlike SGLang's ``/server_info`` (algorithm, draft path,
steps/topk/draft tokens, running acceptance), a vLLM 0.32 server shows neither the method nor
the draft path nor the aux layers: ``/version``, ``/v1/models`` (the target's ``root``,
``max_model_len``) and ``/metrics`` (``vllm:spec_decode_num_drafts_total``,
``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total``, and per draft position
``..._num_accepted_tokens_per_pos_total{position}``: so whether it speculates, how many
tokens it drafts, and the acceptance). Only with ``VLLM_SERVER_DEV_MODE=1`` does
``/server_info?config_format=json`` hold the whole config (method, draft path). So
:func:`verify_vllm_server` checks what it can see: the server speculates (the counters
exist), the method and draft path when dev mode shows them, the draft directory's own config
(an EAGLE-3 architecture; ids in vLLM numbering, from :func:`write_vllm_draft`), and the
acceptance length ``1 + accepted / drafts``. Reads ``DRAFT_DIR`` and writes only the copy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from regen.client.endpoints import server_root
from regen.client.profiles import identify
from regen.client.profiles.vllm import (
    SPEC_ACCEPTED,
    SPEC_ACCEPTED_PER_POS,
    SPEC_DRAFTS,
    dev_config,
    dev_speculative,
)
from regen.client.server_load import counter_total, parse_metrics
from regen.core import jsontext
from regen.core.errors import ConfigError, EndpointError, TrapError
from regen.core.jsontext import JsonObject
from regen.targets import Family

if TYPE_CHECKING:
    from regen.client.profiles.base import Identity
from regen.train import traps
from regen.train.traps import LOW_ACCEPT_LENGTH

log = logging.getLogger(__name__)

#: vLLM's spelling of the one speculative method that feeds an EAGLE-3 draft its aux states
VLLM_EAGLE3 = "eagle3"
#: the key of a vLLM draft copy's record in its config.json
COPY_RECORD = "regen_vllm_draft"
#: the aux-ids key vLLM reads first, and the nested one SpecForge writes
TOP_KEY = "eagle_aux_hidden_state_layer_ids"
CONFIG = "config.json"


def check_method(method: object, where: str) -> None:
    """``method`` must be exactly vLLM's ``eagle3`` (see the module docstring)."""
    if method != VLLM_EAGLE3:
        raise TrapError(
            traps.TRAP_ALGORITHM,
            f"{where} is {method!r}, not exactly {VLLM_EAGLE3!r}: vLLM captures the aux hidden "
            "states only for eagle3; an EAGLE-3 draft would get the last layer alone, and "
            "acceptance drops to ~1.0 (or the draft's architecture does not load).",
            f"set the speculative config's method to {VLLM_EAGLE3} "
            f'(--speculative-config \'{{"method": "{VLLM_EAGLE3}", "model": DRAFT_DIR}}\').',
        )


def check_architecture(archs: object, where: str) -> None:
    """An EAGLE-1 draft (``Eagle...`` but not ``Eagle3``) cannot take vLLM's eagle3 method.
    (A plain ``LlamaForCausalLM`` is fine: vLLM names it ``Eagle3LlamaForCausalLM``.)"""
    names = [a for a in jsontext.iterate(archs or ()) if isinstance(a, str)]
    bad = [a for a in names if a.startswith("Eagle") and "Eagle3" not in a]
    if bad:
        raise TrapError(
            traps.TRAP_ALGORITHM,
            f"{where} is an EAGLE (not EAGLE-3) draft ({bad[0]}): it has no fc over the aux "
            "hidden states, so serving it as eagle3 does not load, and as eagle it is not the "
            "draft regen trained.",
            "serve the EAGLE-3 draft SpecForge exported (architectures LlamaForCausalLMEagle3).",
        )


def read_config(draft_dir: str | Path) -> JsonObject:
    p = Path(draft_dir) / CONFIG
    try:
        cfg = jsontext.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read {p}: {e.strerror or e}", field="draft") from None
    except ValueError as e:
        raise ConfigError(f"{p}: not JSON ({e})", field="draft") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{p}: not a JSON object", field="draft")
    return cfg


def config_aux_ids(cfg: Mapping[str, object]) -> list[int] | None:
    """The aux ids a draft config gives vLLM, in vLLM's order of reading (module docstring)."""
    nested = cfg.get("eagle_config") or {}
    ids = cfg.get(TOP_KEY) or (nested.get(TOP_KEY) if isinstance(nested, Mapping) else None)
    return [int(i) for i in ids] if isinstance(ids, list) and ids else None


def to_vllm_ids(specforge_ids: list[int]) -> list[int]:
    """SpecForge's aux ids in vLLM's numbering (the output of layer i is hidden state i + 1)."""
    return [i + 1 for i in specforge_ids]


def write_vllm_draft(draft_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write (or refresh) the vLLM copy of the SpecForge-numbered draft in ``draft_dir``:
    config.json with the aux ids + 1 and a ``regen_vllm_draft`` record, every other file linked.
    ``out_dir`` defaults to ``DRAFT_DIR-vllm`` beside it. Returns the copy's folder."""
    src = Path(draft_dir).resolve()
    cfg = read_config(src)
    if COPY_RECORD in cfg:
        record = cfg[COPY_RECORD]
        of = record.get("source") if isinstance(record, dict) else record
        raise ConfigError(f"{src} is already a vLLM copy (of {of}): serve it as is", field="draft")
    check_architecture(cfg.get("architectures"), str(src))
    out = Path(out_dir).resolve() if out_dir is not None else src.with_name(src.name + "-vllm")
    if out == src:
        raise ConfigError("the vLLM copy must go to another folder than the draft", field="out")
    ids = config_aux_ids(cfg)
    copy = json.loads(json.dumps(cfg))
    made: dict[str, object] = {"source": str(src), "specforge_aux_layer_ids": ids}
    if ids is not None:
        vids = to_vllm_ids(ids)
        copy.setdefault("eagle_config", {})[TOP_KEY] = vids
        if TOP_KEY in copy:
            copy[TOP_KEY] = vids
        made["vllm_aux_layer_ids"] = vids
    copy[COPY_RECORD] = made
    out.mkdir(parents=True, exist_ok=True)
    for p in src.iterdir():
        if p.name == CONFIG or not p.is_file():
            continue
        link = out / p.name
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(p, link)
    tmp = out / f".{CONFIG}.tmp"
    tmp.write_text(json.dumps(copy, indent=2) + "\n", encoding="utf-8")
    tmp.replace(out / CONFIG)
    log.info("wrote the vLLM copy of %s to %s (aux ids %s -> %s)", src, out, ids,
             made.get("vllm_aux_layer_ids"))  # fmt: skip
    return out


@dataclass(slots=True)
class VllmDraft:
    """A draft directory that passed :func:`check_vllm_draft`."""

    path: str
    specforge_ids: list[int] | None
    vllm_ids: list[int] | None


def check_vllm_draft(draft_dir: str | Path) -> VllmDraft:
    """Refuse a draft vLLM would serve with other aux layers than it was trained on."""
    cfg = read_config(draft_dir)
    check_architecture(cfg.get("architectures"), str(draft_dir))
    ids = config_aux_ids(cfg)
    record = cfg.get(COPY_RECORD)
    if not isinstance(record, dict):
        if ids is None:
            # vLLM's default (2, L // 2, L - 3) is SpecForge's default + 1
            log.warning("%s names no aux layers: vLLM captures its default (2, L//2, L-3)",
                        draft_dir)  # fmt: skip
            return VllmDraft(str(draft_dir), None, None)
        raise TrapError(
            traps.TRAP_LAYER_NUMBERING,
            f"{draft_dir} carries aux layer ids {ids} in SpecForge numbering (no "
            f"{COPY_RECORD} record): vLLM reads them as hidden-state indices and would capture "
            f"the outputs of layers {[i - 1 for i in ids]} where the draft was trained on "
            f"{ids}: one layer early, and acceptance drops without an error.",
            f"serve the copy `regen serve-command {draft_dir} --engine vllm` writes (aux ids "
            f"{to_vllm_ids(ids)}).",
        )
    trained = record.get("specforge_aux_layer_ids")
    trained_ids = _ints(trained)
    want = to_vllm_ids(trained_ids) if trained_ids is not None else None
    if want != ids:
        raise TrapError(
            traps.TRAP_LAYER_NUMBERING,
            f"{draft_dir} is a vLLM copy of a draft trained on layers {trained} (SpecForge "
            f"numbering), but its config now gives vLLM the aux ids {ids}, not {want}.",
            f"rewrite the copy: `regen serve-command {record.get('source')} --engine vllm`.",
        )
    return VllmDraft(str(draft_dir), trained_ids, ids)


def _ints(value: object) -> list[int] | None:
    """``value`` when it is a list of integers, else None."""
    if not isinstance(value, list):
        return None
    ints = [i for i in value if isinstance(i, int)]
    return ints if len(ints) == len(value) else None


def speculative_config(draft_dir: str, num_speculative_tokens: int = 3) -> dict[str, str | int]:
    """vLLM's ``--speculative-config`` for an EAGLE-3 draft."""
    return {
        "method": VLLM_EAGLE3,
        "model": draft_dir,
        "num_speculative_tokens": num_speculative_tokens,
    }


def serve_argv(
    draft_dir: str,
    *,
    target: str,
    tp: int = 8,
    num_speculative_tokens: int = 3,
    host: str = "0.0.0.0",
    port: int = 8000,
    family: Family | None = None,
    trust_remote_code: bool = False,
) -> list[str]:
    """The vLLM command that serves ``target`` with the vLLM-numbered draft in ``draft_dir``;
    ``family``: the target's (its parser flags; None: none)."""
    spec = speculative_config(draft_dir, num_speculative_tokens)
    check_method(spec["method"], "speculative-config method")
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", target,
            "--tensor-parallel-size", str(tp)]  # fmt: skip
    if trust_remote_code:
        argv.append("--trust-remote-code")
    if family is not None:
        argv += family.vllm_flags()
    argv += ["--speculative-config", json.dumps(spec), "--host", host, "--port", str(port)]
    return argv


# ---- a running server ------------------------------------------------------------------------


@dataclass(slots=True)
class SpecCounters:
    """vLLM's speculative counters at one moment."""

    drafts: float  #: verify steps that carried a draft
    accepted: float  #: draft tokens accepted
    draft_tokens: float | None = None
    per_position: dict[int, float] = field(default_factory=dict)

    def accept_length(self) -> float | None:
        """1 + accepted / drafts since the server started (None: no draft yet)."""
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else None

    def since(self, before: SpecCounters) -> float | None:
        """The acceptance length of the traffic between ``before`` and now."""
        drafts = self.drafts - before.drafts
        return 1.0 + (self.accepted - before.accepted) / drafts if drafts > 0 else None


def spec_counters(text: str) -> SpecCounters | None:
    """The speculative counters of a /metrics page (None: the server does not speculate)."""
    samples = parse_metrics(text)
    drafts = counter_total(samples, SPEC_DRAFTS)
    accepted = counter_total(samples, SPEC_ACCEPTED)
    if drafts is None or accepted is None:
        return None
    per_pos: dict[int, float] = {}
    for s in samples:
        if s.name == SPEC_ACCEPTED_PER_POS and s.labels.get("position", "").isdigit():
            pos = int(s.labels["position"])
            per_pos[pos] = per_pos.get(pos, 0.0) + s.value
    return SpecCounters(
        drafts, accepted, counter_total(samples, "vllm:spec_decode_num_draft_tokens_total"),
        dict(sorted(per_pos.items())),
    )  # fmt: skip


def _get(url: str, api_key: str | None, timeout: float) -> tuple[int, str]:
    import httpx2

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx2.get(url, headers=headers, timeout=timeout)
    except httpx2.HTTPError as e:
        raise EndpointError(f"{url}: {type(e).__name__}") from None
    return resp.status_code, resp.text


def read_counters(url: str, *, api_key: str | None = None, timeout: float = 10.0) -> SpecCounters:
    """The speculative counters of the vLLM server at ``url`` now; EndpointError when its
    /metrics does not answer, TrapError when it has no speculative counters."""
    root = server_root(url)
    status, text = _get(f"{root}/metrics", api_key, timeout)
    if status != 200:
        raise EndpointError(f"{root}/metrics: HTTP {status}")
    counters = spec_counters(text)
    if counters is None:
        raise TrapError(
            traps.TRAP_ALGORITHM,
            f"{root} runs no speculative decoding: its /metrics has no "
            "vllm:spec_decode_* counters.",
            'start it with --speculative-config \'{"method": "eagle3", "model": DRAFT_DIR, '
            '"num_speculative_tokens": 3}\'.',
        )
    return counters


def read_dev_speculative(url: str, *, api_key: str | None, timeout: float) -> dict[str, object]:
    """The speculative settings of a dev-mode server's /server_info ({}: not in dev mode)."""
    try:
        status, text = _get(f"{server_root(url)}/server_info?config_format=json", api_key, timeout)
        config = dev_config(json.loads(text)) if status == 200 else None
    except (EndpointError, ValueError):
        return {}
    return dev_speculative(config) if config is not None else {}


@dataclass(slots=True)
class VllmCheck:
    """What :func:`verify_vllm_server` found on a server that passed."""

    url: str
    version: str | None
    draft: VllmDraft | None
    num_speculative_tokens: int | None
    counters: SpecCounters
    #: the method and draft path as dev mode shows them (None: not shown)
    method: str | None = None
    draft_path: str | None = None
    #: what vLLM did not show and so stayed unchecked
    unchecked: list[str] = field(default_factory=list)

    @property
    def avg_accept_length(self) -> float | None:
        return self.counters.accept_length()


def verify_vllm_server(
    url: str,
    draft_dir: str | None,
    *,
    timeout: float = 10.0,
    api_key: str | None = None,
    version: str | None = None,
) -> VllmCheck:
    """Refuse a vLLM server that does not speculate with an EAGLE-3 draft numbered for vLLM
    (module docstring: what is checked, and what vLLM does not expose)."""
    counters = read_counters(url, api_key=api_key, timeout=timeout)
    dev = read_dev_speculative(url, api_key=api_key, timeout=timeout)
    unchecked = []
    if "method" in dev:
        check_method(dev["method"], f"{url} speculative_config.method")
    else:
        unchecked.append("the speculative method (vLLM shows it only in VLLM_SERVER_DEV_MODE)")
    served = dev.get("model")
    if served is None:
        unchecked.append("the draft path the server loaded (not exposed outside dev mode)")
    elif draft_dir is not None and not _same_path(str(served), draft_dir):
        raise TrapError(
            traps.TRAP_WRONG_DRAFT,
            f"{url} serves draft {served!r}, not {draft_dir!r}.",
            f'restart the server with --speculative-config \'{{"model": "{draft_dir}", ...}}\'.',
        )
    draft = check_vllm_draft(draft_dir) if draft_dir is not None else None
    if draft is None:
        unchecked.append("the draft's aux layers (pass --draft DRAFT_DIR)")
    k = dev.get("num_speculative_tokens") or (len(counters.per_position) or None)
    method = dev.get("method")  # eagle3 when shown: check_method
    check = VllmCheck(
        url=url, version=version, draft=draft,
        num_speculative_tokens=k if isinstance(k, int) else None, counters=counters,
        method=method if isinstance(method, str) else None,
        draft_path=None if served is None else str(served), unchecked=unchecked,
    )  # fmt: skip
    accept = check.avg_accept_length
    if accept is not None and accept <= LOW_ACCEPT_LENGTH:
        log.warning("%s: acceptance length %.3f: the draft is not helping", url, accept)
    return check


def _same_path(a: str, b: str) -> bool:
    return os.path.normpath(a) == os.path.normpath(b) or os.path.realpath(a) == os.path.realpath(b)


async def _identify(url: str, api_key: str | None, timeout: float) -> Identity:
    import httpx2

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx2.AsyncClient(timeout=timeout) as http:
        return await identify(http, server_root(url), headers)


def identify_server(url: str, *, api_key: str | None = None, timeout: float = 10.0) -> Identity:
    """Which engine serves ``url`` (regen.client.profiles.Identity)."""
    return asyncio.run(_identify(url, api_key, timeout))
