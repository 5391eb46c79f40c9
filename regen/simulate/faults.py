"""Fault injection: which attempt of which request fails, and how.

A fault is decided per (request key, attempt number): the n-th time the server receives the
same request body it draws ``u = H(fault_seed, key, n)`` in [0, 1) and picks a fault from the
rate intervals ``[fail | rate_limit | disconnect | stall | none]``. Only the first
``faulty_attempts`` attempts of a key can fault (default 3; -1 = every attempt), so a client
that retries eventually succeeds. A ``sequence`` (e.g. ``429,500,disconnect``) overrides the
rates: attempt i of every key gets ``sequence[i]`` and later attempts succeed. Faults never
change the answer.
"""

from __future__ import annotations

import enum
import hashlib

from pydantic import BaseModel, ConfigDict, Field, model_validator

from regen.errors import ConfigError


class Fault(enum.StrEnum):
    FAIL = "fail"  #: HTTP 500 before any byte of the answer
    RATE_LIMIT = "rate_limit"  #: HTTP 429 with Retry-After
    DISCONNECT = "disconnect"  #: the connection is cut half-way through the answer
    STALL = "stall"  #: the answer stops for stall_s seconds half-way, then completes


_ALIASES = {
    "500": Fault.FAIL,
    "fail": Fault.FAIL,
    "429": Fault.RATE_LIMIT,
    "rate_limit": Fault.RATE_LIMIT,
    "disconnect": Fault.DISCONNECT,
    "cut": Fault.DISCONNECT,
    "stall": Fault.STALL,
}


def parse_sequence(text: str) -> tuple[Fault | None, ...]:
    """``"429,500,ok,disconnect"`` → faults per attempt (``ok``/``none`` = no fault)."""
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
                f"unknown fault {raw!r} (use 500, 429, disconnect, stall or ok)",
                field="fault_sequence",
            )
    return tuple(out)


class FaultConfig(BaseModel):
    """Fault rates and their seed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fail_rate: float = Field(0.0, ge=0, le=1)  #: HTTP 500
    rate_limit_rate: float = Field(0.0, ge=0, le=1)  #: HTTP 429 + Retry-After
    disconnect_rate: float = Field(0.0, ge=0, le=1)  #: stream cut mid-way
    stall_rate: float = Field(0.0, ge=0, le=1)  #: pause mid-way
    stall_s: float = Field(5.0, ge=0)  #: length of a stall
    retry_after: float = Field(1.0, ge=0)  #: Retry-After seconds sent with a 429
    fault_seed: int = 0  #: seeds the draws
    faulty_attempts: int = Field(3, ge=-1)  #: attempts per key that may fault; -1 = all
    sequence: tuple[Fault | None, ...] = ()  #: fixed per-attempt faults, overrides the rates

    @model_validator(mode="after")
    def _rates_sum(self) -> FaultConfig:
        total = self.fail_rate + self.rate_limit_rate + self.disconnect_rate + self.stall_rate
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault rates add up to {total:g} > 1")
        return self

    @property
    def active(self) -> bool:
        return bool(
            self.sequence
            or self.fail_rate
            or self.rate_limit_rate
            or self.disconnect_rate
            or self.stall_rate
        )

    def decide(self, key: str, attempt: int) -> Fault | None:
        """The fault for the ``attempt``-th (0-based) request with this key, or None."""
        if self.sequence:
            return self.sequence[attempt] if attempt < len(self.sequence) else None
        if not self.active or (0 <= self.faulty_attempts <= attempt):
            return None
        digest = hashlib.blake2b(
            f"{self.fault_seed}\x00{key}\x00{attempt}".encode(), digest_size=8
        ).digest()
        u = int.from_bytes(digest, "big") / 2.0**64
        for fault, rate in (
            (Fault.FAIL, self.fail_rate),
            (Fault.RATE_LIMIT, self.rate_limit_rate),
            (Fault.DISCONNECT, self.disconnect_rate),
            (Fault.STALL, self.stall_rate),
        ):
            if u < rate:
                return fault
            u -= rate
        return None
