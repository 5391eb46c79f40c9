"""Fault injection: which attempt of which request fails, and how.

A fault is decided per (request key, attempt number): the n-th time the server receives the
same request body it draws ``u = H(fault_seed, key, n)`` in [0, 1) and picks a fault from the
rate intervals ``[fail | rate_limit | overload | retract | abort | disconnect | stall | none]``.
Only the first ``faulty_attempts`` attempts of a key can fault (default 3; -1 = every attempt),
so a client that retries eventually succeeds. A ``fault_sequence`` (e.g. ``503,500,disconnect``)
overrides the rates: attempt i of every key gets ``sequence[i]`` and later attempts succeed.
Faults never change the answer.

What each fault looks like on the wire follows SGLang 0.5.23's own code (docs/simulate.md):
overload, retraction and timeouts are HTTP 503 without Retry-After for a non-streamed request,
and for a streamed one HTTP 200 then ``data: {"error": {..., "code": 503}}``, usage and
``[DONE]`` (the serving layer awaits the first chunk before it sends the status). A 429 with
Retry-After is not SGLang's (gateways send it); it stays as an option.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from regen.core.errors import ConfigError


class Fault(enum.StrEnum):
    FAIL = "fail"  #: HTTP 500 before any byte of the answer
    RATE_LIMIT = "rate_limit"  #: HTTP 429 with Retry-After (a gateway's answer, not SGLang's)
    OVERLOAD = "overload"  #: 503 before any token: the queue is full (--max-queued-requests)
    RETRACT = "retract"  #: 503 half-way: retracted under memory pressure / running timeout
    ABORT = "abort"  #: finish_reason "abort" half-way (a graceful abort, no status)
    DISCONNECT = "disconnect"  #: the connection is cut half-way through the answer
    STALL = "stall"  #: the answer stops for stall_s seconds half-way, then completes


_ALIASES = {
    "500": Fault.FAIL,
    "fail": Fault.FAIL,
    "429": Fault.RATE_LIMIT,
    "rate_limit": Fault.RATE_LIMIT,
    "503": Fault.OVERLOAD,
    "overload": Fault.OVERLOAD,
    "retract": Fault.RETRACT,
    "abort": Fault.ABORT,
    "disconnect": Fault.DISCONNECT,
    "cut": Fault.DISCONNECT,
    "stall": Fault.STALL,
}


def parse_sequence(text: str) -> tuple[Fault | None, ...]:
    """``"503,500,ok,disconnect"`` → faults per attempt (``ok``/``none`` = no fault)."""
    out: list[Fault | None] = []
    for raw in text.split(","):
        item = raw.strip().lower()
        if not item:
            continue
        if item in ("ok", "none", "-"):
            out.append(None)
        elif item in _ALIASES:
            out.append(_ALIASES[item])
        else:
            raise ConfigError(
                f"unknown fault {raw!r} (use 500, 429, 503, retract, abort, disconnect, stall "
                "or ok)",
                field="fault_sequence",
            )
    return tuple(out)


class FaultConfig(BaseModel):
    """Fault rates and their seed (``regen simulate``'s "faults" flags; each field's
    description is its help text)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fail_rate: float = Field(default=0.0, ge=0, le=1, description="HTTP 500 rate")
    rate_limit_rate: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="HTTP 429 + Retry-After rate (a gateway's, not SGLang's)",
    )
    overload_rate: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="overload rate: SGLang's 503 for a full queue (streamed: HTTP 200, then an "
        "error event)",
    )
    retract_rate: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="503 half-way through the answer (retraction, running timeout)",
    )
    abort_rate: float = Field(
        default=0.0, ge=0, le=1, description='finish_reason "abort" half-way through the answer'
    )
    disconnect_rate: float = Field(default=0.0, ge=0, le=1, description="stream cut rate")
    stall_rate: float = Field(default=0.0, ge=0, le=1, description="mid-answer pause rate")
    stall_s: float = Field(default=5.0, ge=0, description="length of a pause (s)")
    retry_after: float = Field(default=1.0, ge=0, description="Retry-After of a 429 (s)")
    fault_seed: int = Field(default=0, description="seeds the fault draws")
    faulty_attempts: int = Field(
        default=3, ge=-1, description="attempts of one request that may fault (-1: all)"
    )
    fault_sequence: tuple[Fault | None, ...] = Field(
        default=(),
        description="fixed faults per attempt, overriding the rates, e.g. "
        "503,429,500,retract,abort,disconnect,stall,ok",
    )

    @field_validator("fault_sequence", mode="before")
    @classmethod
    def _parse(cls, v: Any) -> Any:
        return parse_sequence(v) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _rates_sum(self) -> FaultConfig:
        total = sum(rate for _, rate in self._rates())
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault rates add up to {total:g} > 1")
        return self

    def _rates(self) -> tuple[tuple[Fault, float], ...]:
        return (
            (Fault.FAIL, self.fail_rate),
            (Fault.RATE_LIMIT, self.rate_limit_rate),
            (Fault.OVERLOAD, self.overload_rate),
            (Fault.RETRACT, self.retract_rate),
            (Fault.ABORT, self.abort_rate),
            (Fault.DISCONNECT, self.disconnect_rate),
            (Fault.STALL, self.stall_rate),
        )

    @property
    def active(self) -> bool:
        return bool(self.fault_sequence or any(rate for _, rate in self._rates()))

    def decide(self, key: str, attempt: int) -> Fault | None:
        """The fault for the ``attempt``-th (0-based) request with this key, or None."""
        seq = self.fault_sequence
        if seq:
            return seq[attempt] if attempt < len(seq) else None
        if not self.active or (0 <= self.faulty_attempts <= attempt):
            return None
        digest = hashlib.blake2b(
            f"{self.fault_seed}\x00{key}\x00{attempt}".encode(), digest_size=8
        ).digest()
        u = int.from_bytes(digest, "big") / 2.0**64
        for fault, rate in self._rates():
            if u < rate:
                return fault
            u -= rate
        return None
