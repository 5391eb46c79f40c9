"""SGLang 0.5.23's profile (CONTRACTS §2, §2b: read in the wheel's ``serving_chat.py`` and
``protocol.py``; tests/contract holds it against the wheel's own models).

- ids, streamed: ``return_input_ids_in_sglext`` / ``return_output_ids_in_sglext``; they arrive
  in the ``sglext`` chunk (``choices: []``) after the finish chunk: ``input_ids`` and
  ``output_ids`` (one list per choice);
- ids, not streamed: ``return_prompt_token_ids`` / ``return_token_ids`` (refused with HTTP 400
  when combined with ``stream``); both on the choice: ``prompt_token_ids``,
  ``response_token_ids``;
- reasoning in ``reasoning_content``; identity and speculative settings in ``/server_info``;
  a request's seed matters only under ``--enable-deterministic-inference``;
- with ``--enable-metrics``, Prometheus text at ``/metrics`` (``observability/
  metrics_collector.py``: the scheduler's gauges, the tokenizer manager's counters;
  tests/contract/test_metrics_contract.py holds :data:`METRICS` against the wheel); without
  it ``/metrics`` is a 404.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from regen.client.http import JsonGetter
from regen.client.profiles.base import EngineProfile, Identity, Ids, TokenPath, get_json, id_list
from regen.client.server_load import MetricNames

if TYPE_CHECKING:
    from regen.client.stream import StreamAccumulator


#: server_info keys kept as the endpoint's speculative settings
SPECULATIVE_KEYS = (
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)

#: the series of SGLang's page that say how loaded it is (SchedulerMetricsCollector's gauges:
#: labels model_name, engine_type, tp_rank, pp_rank, moe_ep_rank, dp_rank with DP attention;
#: TokenizerMetricsCollector's counters: model_name, engine_type, and is_streaming on the
#: token counters). ``token_usage`` is the KV pool's used share; ``gen_throughput`` the
#: decode tok/s of the last log interval; ``spec_accept_length`` tokens per verify step.
METRICS = MetricNames(
    prefix="sglang:",
    running="sglang:num_running_reqs",
    queued="sglang:num_queue_reqs",
    kv_usage="sglang:token_usage",
    generation_tokens="sglang:generation_tokens_total",
    prompt_tokens="sglang:prompt_tokens_total",
    gen_throughput="sglang:gen_throughput",
    aborted="sglang:num_aborted_requests_total",
    spec_accept_length="sglang:spec_accept_length",
)


def _count(value: object) -> int | None:
    """``value`` when it is a positive int (a count the server reports), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def batch_slots(server_info: Mapping[str, object]) -> tuple[int | None, str | None]:
    """The server's batch slots and which field gave them: the ``--max-running-requests``
    flag (top-level ``max_running_requests``, None unless given) when set, else the sum of the
    live ``internal_states[i].effective_max_running_requests_per_dp`` (one per DP rank)."""
    flag = _count(server_info.get("max_running_requests"))
    if flag is not None:
        return flag, "max_running_requests"
    states = server_info.get("internal_states") or ()
    per_dp = [
        _count(s.get("effective_max_running_requests_per_dp"))
        for s in (states if isinstance(states, list | tuple) else ())
        if isinstance(s, dict)
    ]
    counts = [n for n in per_dp if n is not None]
    if per_dp and len(counts) == len(per_dp):
        return sum(counts), "internal_states"
    return None, None


def queue_limit(server_info: Mapping[str, object]) -> int | None:
    """The requests the server queues before refusing with 503: ``--max-queued-requests``
    (None unless given), which each data-parallel rank's scheduler applies to its own waiting
    queue, so times ``dp_size``."""
    flag = _count(server_info.get("max_queued_requests"))
    return None if flag is None else flag * (_count(server_info.get("dp_size")) or 1)


def identity_of(data: Mapping[str, object]) -> Identity:
    """The identity in one ``/server_info`` answer."""
    slots, source = batch_slots(data)
    det = data.get("enable_deterministic_inference")
    version = data.get("version")
    return Identity(
        engine="sglang",
        version=str(version) if version is not None else None,
        max_running_requests=slots,
        slots_source=source,
        max_queued_requests=queue_limit(data),
        deterministic=det if isinstance(det, bool) else False,
        speculative={k: data[k] for k in SPECULATIVE_KEYS if data.get(k) is not None},
        server_info=True,
    )


class SGLangProfile(EngineProfile):
    name = "sglang"
    gives_ids = True
    reasoning_field = "reasoning_content"
    seeds_requests = False
    metrics = METRICS

    def ids_fields(self, streaming: bool) -> dict[str, object]:
        if streaming:
            return {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True}
        return {"return_prompt_token_ids": True, "return_token_ids": True}

    def token_path(self, streaming: bool) -> TokenPath:
        return "sglext" if streaming else "sglang_nonstream"

    def stream_ids(self, acc: StreamAccumulator) -> Ids:
        return id_list(acc.prompt_ids), id_list(acc.output_ids)

    def whole_ids(self, data: Mapping[str, object], choice: Mapping[str, object]) -> Ids:
        # SGLang puts both on the choice; older servers put the prompt ids at the top level
        prompt = id_list(choice.get("prompt_token_ids")) or id_list(data.get("prompt_token_ids"))
        return prompt, id_list(choice.get("response_token_ids"))

    async def identify(
        self, http: JsonGetter, root: str, headers: dict[str, str]
    ) -> Identity | None:
        """``/server_info`` (or the older ``/get_server_info``) answers a JSON object."""
        for path in ("/server_info", "/get_server_info"):
            data = await get_json(http, f"{root}{path}", headers)
            # vLLM answers /server_info too, in its dev mode, with its whole config
            if isinstance(data, dict) and "vllm_config" not in data:
                return identity_of(data)
        return None


SGLANG = SGLangProfile()
