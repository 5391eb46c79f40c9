"""Configuration of one simulated server (every ``regen simulate`` option). Owns no files."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from regen.simulate.answer import AnswerConfig
from regen.simulate.faults import FaultConfig

#: SGLang version the simulator reports
SIM_VERSION = "0.5.13-sim"

#: avg_spec_accept_length reported when --spec-accept-length is not given
DEFAULT_ACCEPT_LENGTH = {"EAGLE3": 2.1, "EAGLE": 1.0}


class SimConfig(BaseModel):
    """What one simulated SGLang server looks like and how it behaves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"  #: bind address (loopback by default)
    port: int = Field(0, ge=0, le=65535)  #: 0 = pick a free port
    model_name: str = "moonshotai/Kimi-K2.5"  #: served model id (/v1/models, checked)
    model_path: str | None = None  #: reported model_path/root (default: model_name)
    tokenizer: Path | None = None  #: tokenizer dir: enables token ids in answers
    context_length: int = Field(262144, ge=1)  #: prompt + max_tokens limit
    max_running_requests: int = Field(64, ge=1)  #: R batch slots
    step_ms: float = Field(3.2, gt=0)  #: one decode step
    tokens_per_step: int = Field(1, ge=1)  #: K tokens per slot per step
    instant: bool = False  #: answer at once, no capacity model
    usage_shape: Literal["sglang", "finish"] = "sglang"  #: where streaming usage goes
    token_ids_field: Literal["token_ids", "response_token_ids"] = "token_ids"
    answer: AnswerConfig = AnswerConfig()
    faults: FaultConfig = FaultConfig()
    speculative_algorithm: str | None = None  #: EAGLE, EAGLE3, NEXTN, ...
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    spec_accept_length: float | None = None  #: reported avg_spec_accept_length
    request_log: Path | None = None  #: JSONL, one line per finished request
    ready_file: Path | None = None  #: the base URL is written here once listening
    #: when set, /v1/* and /server_info need ``Authorization: Bearer KEY`` (else 401), as
    #: SGLang's --api-key; /health and /stats stay open. Never reported by the server.
    api_key: str | None = Field(default=None, repr=False)

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        tuning = (
            self.speculative_num_steps,
            self.speculative_eagle_topk,
            self.speculative_num_draft_tokens,
        )
        if self.speculative_algorithm is None and any(t is not None for t in tuning):
            raise ValueError("speculative tuning flags need --speculative-algorithm")
        return self

    @property
    def step_s(self) -> float:
        return self.step_ms / 1000.0

    @property
    def capacity_tok_s(self) -> float:
        return self.max_running_requests * self.tokens_per_step / self.step_s

    @property
    def accept_length(self) -> float | None:
        if self.speculative_algorithm is None:
            return None
        if self.spec_accept_length is not None:
            return self.spec_accept_length
        return DEFAULT_ACCEPT_LENGTH.get(self.speculative_algorithm.upper(), 1.5)
