"""The speed model of speculative decoding (EAGLE / EAGLE-3 on SGLang), as pure functions.

What one decode step of a speculative server does: the draft proposes tokens, the target
verifies them in one forward pass, and each running request keeps the accepted prefix plus one
token of its own (the "bonus" token). So per step a request advances by its **acceptance
length** ``a`` (≥ 1, at most ``num_steps + 1``) instead of 1 token, and the step costs more
than a plain decode step:

    step time (batch b)  =  t0 · r(b),    r(b) = draft_overhead + verify_cost · b

``t0`` is the plain decode step of the same server (the simulator's ``--step-ms``).
``draft_overhead`` is the draft's steps plus the verify pass at an empty batch, relative to
``t0``; ``verify_cost`` is what each running request adds to the verify pass (a plain decode
step is memory-bound and flat in the batch, the verify of ``num_draft_tokens`` per request is
not). Per request, the speedup over the plain server at the same batch is

    speedup(a, b) = a / r(b)                         (falls as the batch grows)

and it crosses 1 at ``b* = (a − draft_overhead) / verify_cost`` (:meth:`SpeedModel.crossover`);
:meth:`SpeedModel.fit` finds both constants from two measured speedups of a real pair.
The defaults (1.25, 0.0163) reproduce the reference case's shape: at ``a = 2.1`` the draft is
1.66× at batch 1 and 0.92× at 64 (82.4 vs 90 tok/s; the real pair measured 82.3 vs 90), and
stops paying near batch 52. A batch of requests with different ``a`` behaves as one with the
token-weighted harmonic mean ``Σ tokens / Σ verify steps`` — exactly the acceptance SGLang
reports and ``regen bench`` measures — so the closed form holds for a mixed level too.

Acceptance per request (:func:`request_accept_length`): an inline marker ``spec_accept=2.6``
in the prompt text, else the first keyword of an :class:`AcceptanceMap` found in the prompt
text (a YAML/JSON mapping file ``{keywords: {xlam: 1.4, ...}, default: 2.1}``), else the
server's default. :func:`effective_accept_length` applies the EAGLE-vs-EAGLE3 trap: an EAGLE-3
draft served under ``EAGLE`` gets only the last hidden state, skips its fc and accepts nothing
(``a = 1.0``, CONTRACTS §2b), while still paying the draft and verify cost.

:class:`SpecRequest` steps one request deterministically (a fractional credit, so a request
with ``a = 2.6`` advances 2, 3, 2, 3, 3, ... tokens) and produces SGLang's per-request
``sglext.spec_tokens_details`` (``SpecTokensDetails`` of SGLang 0.5.23:
``spec_accept_length = completion_tokens / spec_verify_ct`` including the prefill token,
``spec_num_proposed_drafts = verify_ct · (num_draft_tokens − 1)``, the histogram of accepted
drafts per step). :class:`SpecCounters` is the server-wide running total behind
``/server_info`` ``internal_states[0].avg_spec_accept_length`` (accepted tokens of the verify
steps ÷ request-steps since start, None before the first step). :class:`SpecServer` bundles
them for a step loop: a request's :class:`SpecRequest` from its body, a step's time at a
batch, the counters.

Owns no files; :meth:`AcceptanceMap.load` reads the mapping file it is given.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from regen.core.errors import ConfigError
from regen.manifest import config_error, read_yaml_file

#: the acceptance length of an EAGLE-3 draft served under EAGLE (fc skipped: only the bonus
#: token survives each step, CONTRACTS §2b)
BROKEN_ACCEPT_LENGTH = 1.0

#: SGLang's tuning flags when none is given (what its EAGLE auto-choice uses for large models)
DEFAULT_NUM_STEPS = 3
DEFAULT_NUM_DRAFT_TOKENS = 4

#: ``spec_accept=2.6`` anywhere in the prompt text sets that request's acceptance length
INLINE_MARKER = re.compile(r"\bspec_accept=(\d+(?:\.\d+)?)")

DraftKind = Literal["eagle3", "eagle"]

#: an acceptance length: tokens kept per verify step, at least the bonus token
AcceptLength = Annotated[float, Field(ge=1.0, allow_inf_nan=False)]


class SpeedModel(BaseModel):
    """Step cost of a speculative server relative to a plain decode step (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: step time at an empty batch relative to a plain decode step: the draft's steps plus the
    #: verify pass (> 1: speculation always costs something)
    draft_overhead: float = Field(default=1.25, ge=1.0)
    #: extra step time per running request, relative to a plain decode step (the verify pass
    #: grows with the batch; a plain decode step does not)
    verify_cost: float = Field(default=0.0163, ge=0.0)

    @classmethod
    def fit(cls, accept: float, low: tuple[int, float], high: tuple[int, float]) -> SpeedModel:
        """The model through two measured (batch, speedup) points at acceptance ``accept``:
        ``a / s = draft_overhead + verify_cost · b`` at both. A ConfigError when the points
        do not fit the model's shape (the speedup must fall with the batch, from at most
        ``a``)."""
        (b1, s1), (b2, s2) = low, high
        if b1 == b2 or s1 <= 0 or s2 <= 0:
            raise ConfigError("fit needs two different batches with positive speedups")
        cost = (accept / s2 - accept / s1) / (b2 - b1)
        overhead = accept / s1 - cost * b1
        try:
            return cls(draft_overhead=overhead, verify_cost=cost)
        except ValidationError as e:
            raise ConfigError(
                f"speedups {s1:g} at {b1} and {s2:g} at {b2} with acceptance {accept:g} give "
                f"draft_overhead {overhead:.3f}, verify_cost {cost:.4f}: outside the model "
                f"({e.errors()[0]['msg']})"
            ) from None

    def step_ratio(self, batch: int) -> float:
        """r(b): a speculative step's time ÷ a plain decode step's, with ``batch`` running."""
        return self.draft_overhead + self.verify_cost * max(batch, 0)

    def step_s(self, base_step_s: float, batch: int) -> float:
        """Seconds of one speculative step at ``batch`` when a plain step takes ``base_step_s``."""
        return base_step_s * self.step_ratio(batch)

    def speedup(self, accept: float, batch: int) -> float:
        """Speculative ÷ plain tokens per second at the same batch: ``a / r(b)``."""
        return accept / self.step_ratio(batch)

    def crossover(self, accept: float) -> float | None:
        """The batch where the speedup is exactly 1, ``(a − draft_overhead) / verify_cost``.

        ``None`` when it never falls to 1 (``verify_cost`` 0 and ``a`` above the overhead);
        0 or less when speculation never pays.
        """
        if self.verify_cost == 0:
            return None if accept > self.draft_overhead else 0.0
        return (accept - self.draft_overhead) / self.verify_cost

    def tok_s(
        self,
        accept: float | None,
        concurrency: int,
        *,
        step_s: float,
        max_running: int,
        tokens_per_step: int = 1,
    ) -> float:
        """Steady-state output tok/s of a server with ``concurrency`` requests in flight.

        ``accept`` None is the plain server (``tokens_per_step`` per request per step, step
        time flat); otherwise the speculative one (``accept`` per request per step).
        """
        batch = min(max(concurrency, 0), max_running)
        if accept is None:
            return batch * tokens_per_step / step_s
        return batch * accept / self.step_s(step_s, batch)


def max_accept_length(num_steps: int | None) -> int:
    """Most tokens one verify step can keep: the draft's steps plus the bonus token."""
    return (num_steps if num_steps is not None else DEFAULT_NUM_STEPS) + 1


def draft_kind(draft_path: str | Path | None) -> DraftKind:
    """``eagle3`` unless ``DRAFT/config.json`` names a non-EAGLE-3 architecture.

    SGLang's EAGLE-3 drafts are ``*Eagle3*`` architectures (``LlamaForCausalLMEagle3``,
    ``Eagle3DeepseekV2ForCausalLM``); a missing or unreadable config is taken as EAGLE-3, the
    draft regen trains.
    """
    if not draft_path:
        return "eagle3"
    try:
        cfg = json.loads((Path(draft_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "eagle3"
    archs = cfg.get("architectures") if isinstance(cfg, dict) else None
    if not isinstance(archs, list) or not archs:
        return "eagle3"
    return "eagle3" if any("eagle3" in str(a).lower() for a in archs) else "eagle"


def effective_accept_length(algorithm: str | None, kind: DraftKind, accept: float) -> float:
    """What the server really accepts: an EAGLE-3 draft under anything but ``EAGLE3`` is broken.

    SGLang upper-cases the algorithm and maps ``NEXTN`` to ``EAGLE``; only exactly ``EAGLE3``
    captures the aux hidden states an EAGLE-3 draft needs (CONTRACTS §2b).
    """
    if algorithm is None:
        return 1.0
    if kind == "eagle3" and algorithm.upper() != "EAGLE3":
        return BROKEN_ACCEPT_LENGTH
    return accept


def _valid_accept(value: float) -> bool:
    return math.isfinite(value) and value >= 1.0


def _check_accept(value: float, where: str) -> float:
    if not _valid_accept(value):
        raise ConfigError(
            f"{where}: acceptance length {value!r} must be a number >= 1", field=where
        )
    return float(value)


class AcceptanceMap(BaseModel):
    """Acceptance length per prompt keyword (e.g. one keyword per source)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: keyword → acceptance length; the first keyword (in file order) found in the prompt wins
    keywords: dict[Annotated[str, Field(min_length=1)], AcceptLength] = Field(default_factory=dict)
    #: acceptance length of a prompt that names no keyword (None: the server's default)
    default: AcceptLength | None = None

    @classmethod
    def load(cls, path: str | Path) -> AcceptanceMap:
        """A YAML or JSON file ``{keywords: {KEYWORD: A, ...}, default: A}``."""
        p = Path(path)
        data = read_yaml_file(p, "acceptance map")
        try:
            return cls.model_validate(data if data is not None else {})
        except ValidationError as e:
            raise config_error(e, str(p)) from None

    def lookup(self, text: str) -> float | None:
        """The acceptance of the first keyword found in ``text``, else ``default``."""
        for keyword, accept in self.keywords.items():
            if keyword in text:
                return accept
        return self.default


def prompt_text(body: Mapping[str, Any]) -> str:
    """The text of a chat request's messages (string contents and text parts), joined."""
    parts: list[str] = []
    for m in body.get("messages") or ():
        if not isinstance(m, Mapping):
            continue
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                p["text"]
                for p in content
                if isinstance(p, Mapping) and isinstance(p.get("text"), str)
            )
    return "\n".join(parts)


def request_accept_length(
    body: Mapping[str, Any], *, default: float, mapping: AcceptanceMap | None = None
) -> float:
    """A request's configured acceptance: inline ``spec_accept=A``, then the map, then default."""
    text = prompt_text(body)
    m = INLINE_MARKER.search(text)
    if m is not None:
        return _check_accept(float(m.group(1)), "spec_accept")
    if mapping is not None:
        found = mapping.lookup(text)
        if found is not None:
            return found
    return default


@dataclass(slots=True)
class SpecRequest:
    """One request's speculative steps: tokens per step, verify count, accepted drafts."""

    accept: float  #: mean tokens kept per verify step (≥ 1)
    cap: int = DEFAULT_NUM_STEPS + 1  #: most tokens per verify step (num_steps + 1)
    credit: float = 0.0
    verify_ct: int = 0
    step_tokens: int = 0  #: tokens produced by verify steps
    correct_drafts: int = 0  #: accepted draft tokens (bonus excluded)
    histogram: list[int] = field(default_factory=list)  #: steps by accepted drafts

    def __post_init__(self) -> None:
        _check_accept(self.accept, "accept")
        if self.cap < 1:
            raise ConfigError("cap must be >= 1", field="cap")
        self.accept = min(self.accept, float(self.cap))

    def step(self, remaining: int) -> int:
        """One verify step: the tokens it keeps (1..cap, at most ``remaining``)."""
        if remaining <= 0:
            return 0
        self.credit += self.accept
        n = max(1, min(int(self.credit + 1e-9), self.cap))
        self.credit -= n
        n = min(n, remaining)
        self.verify_ct += 1
        self.step_tokens += n
        drafts = n - 1
        self.correct_drafts += drafts
        if len(self.histogram) <= drafts:
            self.histogram.extend([0] * (drafts + 1 - len(self.histogram)))
        self.histogram[drafts] += 1
        return n

    def details(
        self, completion_tokens: int, num_draft_tokens: int | None
    ) -> dict[str, Any] | None:
        """SGLang's ``SpecTokensDetails`` for this request (all nine fields), as
        ``tokenizer_manager._calculate_spec_decoding_metrics`` and
        ``spec_tokens_details_from_meta_info`` build it; None before the first verify step
        (SGLang then sends no details). ``spec_cap_length`` and ``spec_block_accept_length``
        stay 0 and ``spec_cap_lens_histogram`` empty: SGLang fills them only in its ragged
        verify modes."""
        if self.verify_ct <= 0:
            return None
        drafts_per_step = (num_draft_tokens or DEFAULT_NUM_DRAFT_TOKENS) - 1
        proposed = self.verify_ct * drafts_per_step
        return {
            "spec_accept_rate": self.correct_drafts / proposed if proposed > 0 else 0.0,
            "spec_accept_length": completion_tokens / self.verify_ct,
            "spec_cap_length": 0.0,
            "spec_block_accept_length": 0.0,
            "spec_num_correct_drafts": self.correct_drafts,
            "spec_num_proposed_drafts": proposed,
            "spec_verify_ct": self.verify_ct,
            "spec_correct_drafts_histogram": list(self.histogram),
            "spec_cap_lens_histogram": [],
        }


@dataclass(slots=True)
class SpecCounters:
    """Server-wide totals behind ``avg_spec_accept_length`` (a running total since start)."""

    accept_tokens: int = 0  #: tokens kept by verify steps
    forward_ct: int = 0  #: request-steps (each step counts every running request)

    def add(self, tokens: int, requests: int = 1) -> None:
        self.accept_tokens += tokens
        self.forward_ct += requests

    @property
    def avg_accept_length(self) -> float | None:
        return self.accept_tokens / self.forward_ct if self.forward_ct > 0 else None


@dataclass(slots=True)
class SpecServer:
    """One speculating server's side of the model: a :class:`SpecRequest` per request (its
    acceptance from the prompt, the EAGLE trap applied), the time of a step at a batch, and the
    running counters behind ``avg_spec_accept_length``. A step loop uses it as::

        req = server.request(body)                      # when the request is admitted
        dt = server.step_s(base_step_s, len(batch))     # each step
        n = req.step(remaining); server.record_step(sum_of_n, len(batch))
        server.details(req, completion_tokens)          # sglext.spec_tokens_details
    """

    algorithm: str  #: speculative_algorithm as configured (EAGLE3, EAGLE, NEXTN, ...)
    accept_length: float  #: the acceptance of a prompt that names none
    draft: DraftKind = "eagle3"
    mapping: AcceptanceMap | None = None
    num_steps: int | None = None
    num_draft_tokens: int | None = None
    speed: SpeedModel = field(default_factory=SpeedModel)
    counters: SpecCounters = field(default_factory=SpecCounters)

    def request(self, body: Mapping[str, Any]) -> SpecRequest:
        wanted = request_accept_length(body, default=self.accept_length, mapping=self.mapping)
        return SpecRequest(
            effective_accept_length(self.algorithm, self.draft, wanted),
            cap=max_accept_length(self.num_steps),
        )

    @property
    def max_step_tokens(self) -> int:
        """Most tokens one request keeps in one step (``num_steps + 1``)."""
        return max_accept_length(self.num_steps)

    def step_s(self, base_step_s: float, batch: int) -> float:
        return self.speed.step_s(base_step_s, batch)

    def record_step(self, tokens: int, batch: int) -> None:
        """One step of ``batch`` requests that kept ``tokens`` in all."""
        self.counters.add(tokens, batch)

    def run_alone(self, req: SpecRequest, total: int) -> None:
        """Step ``req`` to ``total`` tokens in a batch of its own (a server without a step
        loop): the prefill's token, then verify steps, each counted."""
        produced = min(total, 1)
        while produced < total:
            n = req.step(total - produced)
            produced += n
            self.record_step(n, 1)

    def details(self, req: SpecRequest, completion_tokens: int) -> dict[str, Any] | None:
        return req.details(completion_tokens, self.num_draft_tokens)

    def describe(self) -> dict[str, Any]:
        """The model's settings, for the simulator's block of ``/server_info``."""
        return {
            "draft_kind": self.draft,
            "accept_length": self.accept_length,
            "effective_accept_length": effective_accept_length(
                self.algorithm, self.draft, self.accept_length
            ),
            "accept_map": self.mapping.model_dump() if self.mapping is not None else None,
            "max_step_tokens": self.max_step_tokens,
            **self.speed.model_dump(),
        }
