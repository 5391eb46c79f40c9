"""The two servers of a bench: their speculative flags (checked as ``verify-server`` does) and
their running acceptance length.

The speculative server must run exactly ``EAGLE3`` (and, with ``--draft``, that draft): the
same checks ``regen verify-server`` makes (:func:`regen.serve.sglang.check_server_info` for
SGLang, :func:`regen.serve.vllm.verify_vllm_server` for vLLM, whose /metrics counters
and draft config stand in for the /server_info it does not have), but a trap found here is
recorded as a finding instead of stopping the bench, since measuring a misconfigured server
is what shows the damage. The baseline server must not speculate at all. Owns no files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from regen.bench.report import ServerFlags
from regen.client.server_info import fetch_server_info
from regen.core import jsontext
from regen.core.errors import EndpointError, RegenError, TrapError
from regen.manifest import public_url
from regen.serve import vllm as vllm_serving
from regen.serve.sglang import accept_lengths, check_server_info

Role = Literal["baseline", "speculative"]


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def mean_accept_length(info: Mapping[str, object]) -> float | None:
    """The mean of ``internal_states[i].avg_spec_accept_length`` (None: not reported)."""
    values = accept_lengths(info)
    return sum(values) / len(values) if values else None


def read_accept_length(url: str, *, api_key: str | None, timeout: float = 10.0) -> float | None:
    """The server's running ``avg_spec_accept_length`` now (None: not reported or no answer)."""
    try:
        return mean_accept_length(fetch_server_info(url, timeout=timeout, api_key=api_key))
    except EndpointError:
        return None


def server_flags(
    role: Role,
    url: str,
    *,
    api_key: str | None,
    draft: str | None = None,
    timeout: float = 10.0,
) -> ServerFlags:
    """Read ``/server_info`` (vLLM: its counters) and check the flags for ``role``; a server
    without either is noted."""
    shown = public_url(url)
    found = vllm_serving.identify_server(url, api_key=api_key, timeout=timeout)
    if found.engine == "vllm":
        return vllm_flags(role, url, shown, api_key=api_key, draft=draft, timeout=timeout,
                          version=found.version)  # fmt: skip
    try:
        info = fetch_server_info(url, timeout=timeout, api_key=api_key)
    except EndpointError as e:
        flags = ServerFlags(role=role, url=shown, server_info=False)
        if role == "speculative":
            flags.problem = f"cannot read its flags ({e}); the speculative settings are unchecked"
        return flags
    return flags_of(role, shown, info, draft=draft)


def vllm_flags(
    role: Role,
    url: str,
    shown: str,
    *,
    api_key: str | None,
    draft: str | None,
    timeout: float,
    version: str | None,
) -> ServerFlags:
    """A vLLM server's flags: speculating or not (its counters), what dev mode shows, and for
    the speculative role the checks of verify-server."""
    flags = ServerFlags(role=role, url=shown, engine="vllm", version=version, server_info=False)
    try:
        counters = vllm_serving.read_counters(url, api_key=api_key, timeout=timeout)
    except TrapError as e:  # no speculative counters
        if role == "speculative":
            flags.trap, flags.problem = e.trap, str(e)
        return flags
    except EndpointError as e:
        if role == "speculative":
            flags.problem = (
                f"cannot read its /metrics ({e}); the speculative settings are unchecked"
            )
        return flags
    dev = vllm_serving.read_dev_speculative(url, api_key=api_key, timeout=timeout)
    flags.algorithm = _text(dev.get("method"))
    flags.draft_path = _text(dev.get("model"))
    flags.num_draft_tokens = _int(dev.get("num_speculative_tokens")) or (
        len(counters.per_position) or None
    )
    flags.accept_length_at_start = counters.accept_length()
    if role == "baseline":
        flags.trap = "baseline-speculates"
        flags.problem = (
            f"the baseline server runs speculative decoding ({flags.algorithm or 'vLLM'}): the "
            "speedup would compare two speculative servers; start the baseline without "
            "--speculative-config"
        )
        return flags
    try:
        vllm_serving.verify_vllm_server(url, draft, timeout=timeout, api_key=api_key)
    except TrapError as e:
        flags.trap, flags.problem = e.trap, str(e)
    except RegenError as e:  # an unreadable draft dir: noted, the bench still measures
        flags.problem = str(e)
    return flags


def flags_of(role: Role, url: str, info: Mapping[str, object], *, draft: str | None) -> ServerFlags:
    """The flags of one /server_info answer and what the check found (pure)."""
    states = [s for s in jsontext.iterate(info.get("internal_states") or []) if isinstance(s, dict)]
    live = _int(states[0].get("effective_max_running_requests_per_dp")) if states else None
    algo = info.get("speculative_algorithm")
    version = info.get("version")
    flags = ServerFlags(
        role=role,
        url=url,
        engine="sglang",
        algorithm=str(algo) if algo is not None else None,
        draft_path=_text(info.get("speculative_draft_model_path")),
        num_steps=_int(info.get("speculative_num_steps")),
        eagle_topk=_int(info.get("speculative_eagle_topk")),
        num_draft_tokens=_int(info.get("speculative_num_draft_tokens")),
        max_running_requests=live or _int(info.get("max_running_requests")),
        version=None if version is None else str(version),
        accept_length_at_start=mean_accept_length(info),
    )
    if role == "baseline":
        if algo is not None:
            flags.trap = "baseline-speculates"
            flags.problem = (
                f"the baseline server runs speculative decoding ({algo}): the speedup would "
                "compare two speculative servers; start the baseline without --speculative-*"
            )
        return flags
    try:
        check_server_info(info, url, draft)
    except TrapError as e:
        flags.trap = e.trap
        flags.problem = str(e)
    return flags
