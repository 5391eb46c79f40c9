"""Configuration of one simulated server: every ``regen simulate`` option, spelled once.

:class:`SimConfig` is the single source of the simulator's options: each field's default,
constraints and ``description`` (its help text). ``regen simulate``'s flags are generated from
it (:mod:`regen.devkit.simulate.flags`), and tests build it from the same flat option names
(:meth:`SimConfig.from_flat`: ``max_running_requests=8``, ``fault_sequence="503,ok"``,
``mean_tokens=24``). Fields of the nested ``answer`` and ``faults`` models are flat flags too.
Owns no files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from regen.core.errors import ConfigError
from regen.devkit.simulate.answer import AnswerConfig
from regen.devkit.simulate.faults import FaultConfig
from regen.devkit.simulate.speculative import (
    AcceptanceMap,
    DraftKind,
    SpecServer,
    SpeedModel,
    draft_kind,
    effective_accept_length,
)

#: SGLang version the simulator reports (the one tests/contract pins, with a marker)
SIM_VERSION = "0.5.23-sim"

#: acceptance length of a request when neither --spec-accept-length nor the prompt says (the
#: reference case's trained draft)
DEFAULT_ACCEPT_LENGTH = 2.1

#: SGLang's health-check timeout and the variable it reads it from (http_server.py:
#: ``HEALTH_CHECK_TIMEOUT = int(os.getenv("SGLANG_HEALTH_CHECK_TIMEOUT", 20))``)
HEALTH_TIMEOUT_ENV = "SGLANG_HEALTH_CHECK_TIMEOUT"
DEFAULT_HEALTH_TIMEOUT_S = 20.0

#: prefill cost (µs per uncached prompt token) of a large MoE (DeepSeek-V3 / Kimi-K2 class)
#: on one node of 8 GPUs: ~50,000 prompt tok/s (docs/simulate.md "Prefill" has the sources)
LARGE_MOE_PREFILL_US_PER_TOKEN = 20.0

#: SGLang's tokenizer_manager.create_abort_task sleeps this long before aborting a request
#: whose stream was closed
SGLANG_ABORT_DELAY_S = 2.0

#: the speed model's defaults (regen.devkit.simulate.speculative.SpeedModel: one spelling)
_SPEED = SpeedModel()

#: options that only mean something on a speculative server
_SPEC_ONLY = (
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "spec_accept_length",
    "spec_accept_map",
    "spec_draft_kind",
    "spec_draft_overhead",
    "spec_verify_cost",
)


class SimConfig(BaseModel):
    """What one simulated SGLang server looks like and how it behaves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(
        default="127.0.0.1", description="bind address", json_schema_extra={"group": "server"}
    )
    port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="port; 0 picks a free one",
        json_schema_extra={"group": "server"},
    )
    ready_file: Path | None = Field(
        default=None,
        description="write the base URL incl. /v1 (what --endpoint takes) here once listening",
        json_schema_extra={"group": "server"},
    )
    request_log: Path | None = Field(
        default=None,
        description="JSONL line per finished request",
        json_schema_extra={"group": "server"},
    )
    model_name: str = Field(
        default="moonshotai/Kimi-K2.5",
        description="served model id",
        json_schema_extra={"group": "server"},
    )
    model_path: str | None = Field(
        default=None,
        description="reported model path (default: the model name)",
        json_schema_extra={"group": "server"},
    )
    tokenizer: Path | None = Field(
        default=None,
        description="tokenizer dir: enables token ids (on the choice, and in sglext when streamed)",
        json_schema_extra={"group": "server"},
    )
    tokenizer_class: str | None = Field(
        default=None,
        description="the class AutoTokenizer resolves for --tokenizer "
        "(regen.template.tokenizer.class_spec): loaded directly, without torch",
        json_schema_extra={"group": "server"},
    )
    context_length: int = Field(
        default=262144,
        ge=1,
        description="prompt + max_tokens limit",
        json_schema_extra={"group": "server"},
    )
    api_key: str | None = Field(
        default=None,
        repr=False,
        description="require 'Authorization: Bearer KEY' everywhere but /health* (as SGLang's "
        "--api-key; /stats stays open)",
        json_schema_extra={"group": "server"},
    )
    enable_deterministic_inference: bool = Field(
        default=False,
        description="report SGLang's --enable-deterministic-inference (the only mode in which "
        "SGLang honours a request's seed)",
        json_schema_extra={"group": "server"},
    )
    enable_metrics: bool = Field(
        default=False,
        description="SGLang's --enable-metrics: serve Prometheus text at /metrics (without it "
        "SGLang's /metrics is a 404; a vLLM server always serves it)",
        json_schema_extra={"group": "server"},
    )
    engine: Literal["sglang", "vllm"] = Field(
        default="sglang",
        description="which engine's wire to speak: SGLang 0.5.23 or vLLM 0.32 (ids, reasoning "
        "field, identity endpoints, error and overload shapes: regen/devkit/simulate/dialect.py)",
        json_schema_extra={"group": "server"},
    )
    health_check_timeout_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="seconds /health_generate (and /health) wait for the scheduler before "
        "answering 503, SGLang's HEALTH_CHECK_TIMEOUT (http_server.py; default: "
        f"${HEALTH_TIMEOUT_ENV} as SGLang reads it, else {DEFAULT_HEALTH_TIMEOUT_S:g})",
        json_schema_extra={"group": "server"},
    )
    health_endpoint_generation: bool = Field(
        default=True,
        description="/health is the /health_generate check, as in SGLang 0.5.23 by default "
        "(SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION); off: /health answers 200 at once",
        json_schema_extra={"group": "server"},
    )
    usage_shape: Literal["sglang", "finish"] = Field(
        default="sglang",
        description="streaming usage: last chunk with choices [] (sglang) or on the "
        "finish_reason chunk (finish, transformers-serve shape)",
        json_schema_extra={"group": "server"},
    )
    max_running_requests: int | None = Field(
        default=None,
        ge=1,
        description="SGLang's --max-running-requests: the batch slots, reported at the top "
        "level of /server_info (None, as SGLang without the flag: --memory-slots decide)",
        json_schema_extra={"group": "capacity model"},
    )
    memory_slots: int = Field(
        default=64,
        ge=1,
        description="batch slots when --max-running-requests is not given (SGLang derives "
        "them from KV memory; reported only in internal_states)",
        json_schema_extra={"group": "capacity model"},
    )
    dp_size: int = Field(
        default=1,
        ge=1,
        description="data-parallel ranks: internal_states entries, each reporting its share "
        "of the slots as effective_max_running_requests_per_dp",
        json_schema_extra={"group": "capacity model"},
    )
    max_queued_requests: int | None = Field(
        default=None,
        ge=0,
        description="SGLang's --max-queued-requests: a request finding this many waiting is "
        "refused with 503 'The request queue is full.' (streamed: HTTP 200, then the error "
        "event); under --engine vllm, vLLM's --max-num-queued-reqs: a cap on running plus "
        "waiting (None: no limit)",
        json_schema_extra={"group": "capacity model"},
    )
    max_total_tokens: int | None = Field(
        default=None,
        ge=1,
        description="SGLang's --max-total-tokens: the KV pool in tokens; a running request "
        "holds its prompt and its output so far (/metrics token_usage, kv_cache_usage_perc; "
        "default 8192 per batch slot)",
        json_schema_extra={"group": "capacity model"},
    )
    step_ms: float = Field(
        default=3.2,
        gt=0,
        description="one decode step (ms)",
        json_schema_extra={"group": "capacity model"},
    )
    tokens_per_step: int = Field(
        default=1,
        ge=1,
        description="K tokens per slot per step",
        json_schema_extra={"group": "capacity model"},
    )
    instant: bool = Field(
        default=False,
        description="answer at once (no capacity model)",
        json_schema_extra={"group": "capacity model"},
    )
    prefill_us_per_token: float = Field(
        default=0.0,
        ge=0,
        allow_inf_nan=False,
        description="prefill cost: microseconds of server time per uncached prompt token, "
        "added to the step that prefills it (0: prefill is free, the model before issue 43; "
        f"{LARGE_MOE_PREFILL_US_PER_TOKEN:g} is a large MoE on 8 GPUs, docs/simulate.md)",
        json_schema_extra={"group": "prefill and prefix cache"},
    )
    chunked_prefill_size: int = Field(
        default=8192,
        ge=1,
        description="SGLang's --chunked-prefill-size: prompt tokens one step prefills at most "
        "(a longer prompt takes several steps)",
        json_schema_extra={"group": "prefill and prefix cache"},
    )
    prefix_cache: bool = Field(
        default=True,
        description="keep a prefix cache (SGLang's radix cache; vLLM's --enable-prefix-caching): "
        "a prompt's cached prefix is not prefilled; off: every prompt token is",
        json_schema_extra={"group": "prefill and prefix cache"},
    )
    prefix_cache_tokens: int | None = Field(
        default=None,
        ge=0,
        description="the prefix cache's capacity in tokens, least recently used evicted first "
        "(default: the KV pool, --max-total-tokens)",
        json_schema_extra={"group": "prefill and prefix cache"},
    )
    prefix_cache_block_size: int | None = Field(
        default=None,
        ge=1,
        description="cached tokens count in whole blocks of this size (default: 1 under "
        "--engine sglang, SGLang's page size; 16 under vllm, vLLM's block size)",
        json_schema_extra={"group": "prefill and prefix cache"},
    )
    enable_cache_report: bool = Field(
        default=False,
        description="report cached prompt tokens in usage.prompt_tokens_details.cached_tokens "
        "(SGLang's --enable-cache-report; vLLM's --enable-prompt-tokens-details)",
        json_schema_extra={"group": "prefill and prefix cache"},
    )
    abort_delay_s: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="seconds a closed stream's request keeps its batch slot (and generates) "
        "before the engine aborts it (default: 2 under --engine sglang, whose "
        "create_abort_task sleeps 2 s; 0 under vllm, which aborts at once)",
        json_schema_extra={"group": "prefill and prefix cache"},
    )
    background_requests: int = Field(
        default=0,
        ge=0,
        description="a second client of this server: requests it keeps in the server at all "
        "times, each sent again as soon as it ends (they take batch slots and queue places "
        "and show in /metrics and /stats, as another client of a shared server does)",
        json_schema_extra={"group": "shared server"},
    )
    background_max_tokens: int = Field(
        default=512,
        ge=1,
        description="output tokens of each background request",
        json_schema_extra={"group": "shared server"},
    )
    background_prompt_tokens: int = Field(
        default=256,
        ge=0,
        description="prompt tokens of each background request",
        json_schema_extra={"group": "shared server"},
    )
    hang_at_s: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="the server hangs S seconds after it began serving (the scheduler stops: "
        "no byte of any answer, new requests get nothing, /health_generate fails after its "
        "timeout)",
        json_schema_extra={"group": "outages"},
    )
    hang_after: int | None = Field(
        default=None,
        ge=1,
        description="the server hangs when the N-th chat request arrives (it and every later "
        "one, and every answer under way, get nothing more)",
        json_schema_extra={"group": "outages"},
    )
    hang_for_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="a hang ends after D seconds and everything carries on where it stopped "
        "(default: it never ends)",
        json_schema_extra={"group": "outages"},
    )
    overload_at_s: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="a 503 storm S seconds after the server began serving: every new chat "
        "request is refused as --overload-rate refuses it (SGLang's full-queue 503)",
        json_schema_extra={"group": "outages"},
    )
    overload_after: int | None = Field(
        default=None,
        ge=1,
        description="a 503 storm from the N-th chat request on (it is refused too)",
        json_schema_extra={"group": "outages"},
    )
    overload_for_s: float = Field(
        default=30.0,
        gt=0,
        allow_inf_nan=False,
        description="length of the 503 storm (s)",
        json_schema_extra={"group": "outages"},
    )
    answer: AnswerConfig = AnswerConfig()
    faults: FaultConfig = FaultConfig()
    speculative_algorithm: str | None = Field(
        default=None,
        description="EAGLE, EAGLE3, NEXTN, ...",
        json_schema_extra={"group": "speculative decoding"},
    )
    speculative_draft_model_path: str | None = Field(
        default=None,
        description="reported draft path",
        json_schema_extra={"group": "speculative decoding"},
    )
    speculative_num_steps: int | None = Field(
        default=None,
        description="reported --speculative-num-steps",
        json_schema_extra={"group": "speculative decoding"},
    )
    speculative_eagle_topk: int | None = Field(
        default=None,
        description="reported --speculative-eagle-topk",
        json_schema_extra={"group": "speculative decoding"},
    )
    speculative_num_draft_tokens: int | None = Field(
        default=None,
        description="reported --speculative-num-draft-tokens",
        json_schema_extra={"group": "speculative decoding"},
    )
    spec_accept_length: float | None = Field(
        default=None,
        ge=1.0,
        allow_inf_nan=False,
        description="acceptance length (tokens kept per verify step) of a request whose prompt "
        "names none (default 2.1; 1.0 under EAGLE with an eagle3 draft)",
        json_schema_extra={"group": "speculative decoding"},
    )
    spec_accept_map: Path | None = Field(
        default=None,
        description="YAML/JSON file {keywords: {KEYWORD: A, ...}, default: A}: a request's "
        "acceptance is that of the first keyword found in its prompt (an inline "
        "'spec_accept=A' in the prompt wins)",
        json_schema_extra={"group": "speculative decoding"},
    )
    spec_draft_kind: DraftKind | None = Field(
        default=None,
        description="the draft's kind (default: from the draft's config.json architectures; "
        "eagle3 when unreadable): an eagle3 draft under anything but EAGLE3 accepts 1.0",
        json_schema_extra={"group": "speculative decoding"},
    )
    spec_draft_overhead: float = Field(
        default=_SPEED.draft_overhead,
        ge=1.0,
        description="speed model: a speculative step at an empty batch ÷ a plain step "
        "(docs/bench.md)",
        json_schema_extra={"group": "speculative decoding"},
    )
    spec_verify_cost: float = Field(
        default=_SPEED.verify_cost,
        ge=0.0,
        description="speed model: step time each running request adds ÷ a plain step",
        json_schema_extra={"group": "speculative decoding"},
    )
    spec_tokens_details: bool = Field(
        default=True,
        description="answer return_spec_tokens_details with sglext.spec_tokens_details, as "
        "SGLang 0.5.23 does (off: a server that reports only /server_info's running average)",
        json_schema_extra={"group": "speculative decoding"},
    )

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        if self.speculative_algorithm is None:
            given = [n for n in _SPEC_ONLY if n in self.model_fields_set]
            if given:
                flags = ", ".join("--" + n.replace("_", "-") for n in given)
                raise ValueError(f"{flags} need --speculative-algorithm")
        elif self.tokens_per_step != 1:
            raise ValueError(
                "--tokens-per-step is the plain server's; a speculative step keeps each "
                "request's acceptance length (--spec-accept-length, --spec-accept-map)"
            )
        if self.instant:
            queued = [f for f, on in (("background_requests", self.background_requests > 0),
                                      ("max_queued_requests", self.max_queued_requests is not None))
                      if on]  # fmt: skip
            if queued:
                flags = ", ".join("--" + n.replace("_", "-") for n in queued)
                raise ValueError(f"{flags} need the capacity model (not --instant: no queue)")
        if self.hang_for_s is not None and self.hang_at_s is None and self.hang_after is None:
            raise ValueError("--hang-for-s needs --hang-at-s or --hang-after")
        if "overload_for_s" in self.model_fields_set and (
            self.overload_at_s is None and self.overload_after is None
        ):
            raise ValueError("--overload-for-s needs --overload-at-s or --overload-after")
        if self.slots % self.dp_size:
            raise ValueError(f"{self.slots} batch slots do not split over dp_size {self.dp_size}")
        return self

    @classmethod
    def from_flat(cls, options: Mapping[str, Any]) -> SimConfig:
        """Built from flat option names (the flags without ``--``, with underscores); fields
        of ``answer`` and ``faults`` go to those models. A bad or unknown option is a
        ConfigError naming it."""
        top: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {"answer": {}, "faults": {}}
        owners = {n: "answer" for n in AnswerConfig.model_fields}
        owners |= {n: "faults" for n in FaultConfig.model_fields}
        for key, value in options.items():
            if key in owners:
                nested[owners[key]][key] = value
            elif key in cls.model_fields and key not in nested:
                top[key] = value
            else:
                raise ConfigError(f"regen simulate: unknown option {key!r}", field=key)
        try:
            return cls(
                **top,
                answer=AnswerConfig(**nested["answer"]),
                faults=FaultConfig(**nested["faults"]),
            )
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"]) or "options"
            raise ConfigError(f"regen simulate: {where}: {err['msg']}", field=where) from None

    @property
    def health_timeout_s(self) -> float:
        """How long a health check waits for the scheduler: the option, else SGLang's
        ``$SGLANG_HEALTH_CHECK_TIMEOUT``, else 20 s (a bad variable is a ConfigError)."""
        if self.health_check_timeout_s is not None:
            return self.health_check_timeout_s
        raw = os.environ.get(HEALTH_TIMEOUT_ENV)
        if raw is None:
            return DEFAULT_HEALTH_TIMEOUT_S
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 0 < value < float("inf"):
            raise ConfigError(f"{HEALTH_TIMEOUT_ENV}={raw!r} is not a number of seconds > 0",
                              field=HEALTH_TIMEOUT_ENV)  # fmt: skip
        return value

    @property
    def slots(self) -> int:
        """The batch slots the capacity model runs (R)."""
        return self.max_running_requests or self.memory_slots

    @property
    def kv_tokens(self) -> int:
        """The KV pool in tokens (``max_total_tokens``, default 8192 per batch slot)."""
        return self.max_total_tokens or 8192 * self.slots

    @property
    def cache_tokens(self) -> int:
        """The prefix cache's capacity (default: the KV pool)."""
        if self.prefix_cache_tokens is not None:
            return self.prefix_cache_tokens
        return self.kv_tokens

    @property
    def cache_block_size(self) -> int:
        if self.prefix_cache_block_size is not None:
            return self.prefix_cache_block_size
        return 1 if self.engine == "sglang" else 16

    @property
    def abort_delay(self) -> float:
        """Seconds a closed stream's request runs on before the engine aborts it."""
        if self.abort_delay_s is not None:
            return self.abort_delay_s
        return SGLANG_ABORT_DELAY_S if self.engine == "sglang" else 0.0

    @property
    def step_s(self) -> float:
        return self.step_ms / 1000.0

    @property
    def capacity_tok_s(self) -> float:
        """Output tok/s with every slot busy (speculative: at the default acceptance)."""
        if self.speculative_algorithm is None:
            return self.slots * self.tokens_per_step / self.step_s
        return self.speed.tok_s(
            effective_accept_length(
                self.speculative_algorithm, self.draft_kind, self.accept_length
            ),
            self.slots,
            step_s=self.step_s,
            max_running=self.slots,
        )

    @property
    def accept_length(self) -> float:
        """The acceptance of a request whose prompt names none (before the EAGLE trap)."""
        return self.spec_accept_length or DEFAULT_ACCEPT_LENGTH

    @property
    def draft_kind(self) -> DraftKind:
        return self.spec_draft_kind or draft_kind(self.speculative_draft_model_path)

    @property
    def speed(self) -> SpeedModel:
        return SpeedModel(
            draft_overhead=self.spec_draft_overhead, verify_cost=self.spec_verify_cost
        )

    def speculation(self) -> SpecServer | None:
        """The speed model of a speculative server (None without --speculative-algorithm);
        reads --spec-accept-map (a bad file is a ConfigError naming it)."""
        if self.speculative_algorithm is None:
            return None
        mapping = AcceptanceMap.load(self.spec_accept_map) if self.spec_accept_map else None
        return SpecServer(
            algorithm=self.speculative_algorithm,
            accept_length=self.accept_length,
            draft=self.draft_kind,
            mapping=mapping,
            num_steps=self.speculative_num_steps,
            num_draft_tokens=self.speculative_num_draft_tokens,
            speed=self.speed,
        )
