"""``bench.json``: the machine-readable result of ``regen bench``, a versioned strict schema.

Layout (``schema_version`` 1; every model refuses unknown keys, so a reader of another version
fails loudly instead of misreading)::

    {"schema_version": 1, "created_at": ISO-8601 UTC, "regen_version", "model",
     "settings": {concurrency, per_source, max_tokens, prompts, prompts_file, run_dir,
                  sampling, request_timeout_s, api_key_env},
     "servers": {"baseline": ServerFlags, "speculative": ServerFlags},
     "levels": [{"concurrency", "baseline": LevelStats, "speculative": LevelStats,
                 "speedup"}],
     "crossover": {"concurrency", "last_paying", "first_losing"},
     "acceptance": {"overall", "method", "exact"},
     "sources": [{"source", "kind", "prompts", "requests", "completion_tokens", "verify_ct",
                  "accept_length", "method", "exact"}],
     "greedy": {"compared", "identical", "method", "tokens", "differing"} | null,
     "verdicts": [{"severity", "code", "text"}]}

``method`` says where an acceptance length came from: ``spec_tokens_details`` (per request,
SGLang's ``sglext``; exact), ``server_info`` (the change of ``avg_spec_accept_length`` across
a level or a per-source pass; exact only when the server's running total started with the
bench), ``metrics`` (vLLM: the change of its ``vllm:spec_decode_*`` counters across a level or
a per-source pass, ``1 + Δaccepted / Δdrafts``; exact) or ``none``. ``ServerFlags.engine``
names the engine (``sglang``, ``vllm``; absent in files written before it). ``greedy``
compares the two servers' answers at concurrency 1 when the sampling is greedy (absent in
files written before it; :mod:`regen.bench.greedy`).
:func:`write_report` writes the file atomically; :func:`read_report`
refuses another schema version with a clear error. API keys never appear (only the name of
the environment variable that held one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from regen.core.errors import ConfigError
from regen.manifest import config_error

SCHEMA_VERSION: Final = 1
BENCH_JSON = "bench.json"

AcceptMethod = Literal["spec_tokens_details", "server_info", "metrics", "none"]
Severity = Literal["good", "info", "warning", "problem"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerFlags(_Strict):
    """What a server said of its speculation at the start (SGLang: /server_info; vLLM: its
    /metrics counters and, in dev mode, its config), and what the flags check found."""

    #: "baseline" or "speculative"
    role: Literal["baseline", "speculative"]
    #: the engine profile recognised ("sglang", "vllm", "openai"; None: not recorded)
    engine: str | None = None
    #: the server's URL as given (never with user:password)
    url: str
    #: speculative_algorithm as the engine spells it (SGLang "EAGLE3", vLLM "eagle3"; None: no
    #: speculation, or not shown: vLLM shows its method only in dev mode)
    algorithm: str | None = None
    #: speculative_draft_model_path
    draft_path: str | None = None
    #: speculative_num_steps
    num_steps: int | None = None
    #: speculative_eagle_topk
    eagle_topk: int | None = None
    #: speculative_num_draft_tokens (vLLM: num_speculative_tokens)
    num_draft_tokens: int | None = None
    #: the live batch limit (internal_states[0].effective_max_running_requests_per_dp, else the
    #: max_running_requests flag)
    max_running_requests: int | None = None
    #: SGLang version
    version: str | None = None
    #: avg_spec_accept_length when the bench started (vLLM: 1 + accepted / drafts since it
    #: started; None: not reported yet)
    accept_length_at_start: float | None = None
    #: whether the server answered /server_info at all
    server_info: bool = True
    #: the trap the flags check found (e.g. "eagle-vs-eagle3"), None when it passed
    trap: str | None = None
    #: what the flags check found, in words (None when it passed)
    problem: str | None = None


class LevelStats(_Strict):
    """One server at one concurrency level."""

    #: requests sent
    requests: int
    #: requests that finished with usage
    ok: int
    #: failed requests by error class (regen.core.errors kinds)
    errors: dict[str, int] = Field(default_factory=dict)
    #: seconds from the first request sent to the last one finished
    wall_s: float
    #: server-counted completion tokens of the ok requests
    completion_tokens: int
    #: completion tokens produced while all the level's requests were in flight ÷ that time
    #: (the steady state; the level's drain is left out: regen/bench/stats.py)
    output_tok_s: float
    #: seconds all the level's requests were in flight (None: output_tok_s is wall-based)
    full_s: float | None = None
    #: completion_tokens / wall_s (drain included)
    wall_tok_s: float | None = None
    #: ok requests / wall_s
    requests_per_s: float
    #: time to the first token, median and 95th percentile, seconds
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    #: whole-request latency, median and 95th percentile, seconds
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    #: per-request decode speed after the first token, median, tok/s
    decode_tok_s_p50: float | None = None
    #: acceptance length at this level (speculative server only)
    accept_length: float | None = None
    #: where it came from
    accept_method: AcceptMethod = "none"


class LevelResult(_Strict):
    """Both servers at one concurrency level."""

    #: requests in flight
    concurrency: int
    baseline: LevelStats
    speculative: LevelStats
    #: speculative ÷ baseline output tok/s (None when either has no tokens)
    speedup: float | None = None


class Crossover(_Strict):
    """Where speculation stops paying."""

    #: the concurrency where the speedup crosses 1, interpolated on log(concurrency) between the
    #: last level that pays and the first that does not (None: no crossing measured)
    concurrency: float | None = None
    #: the highest measured level with speedup > 1 below the crossing
    last_paying: int | None = None
    #: the lowest measured level with speedup <= 1 above the crossing
    first_losing: int | None = None


class Acceptance(_Strict):
    """The speculative server's acceptance length over the whole bench."""

    overall: float | None = None
    method: AcceptMethod = "none"
    #: False when the server's running total included traffic from before the bench
    exact: bool = True


class SourceResult(_Strict):
    """Acceptance on one source's prompts."""

    source: str
    #: what kind of data it is ("tool-calling", "code", "reasoning", "chat", ...)
    kind: str
    #: distinct prompts of the source
    prompts: int
    #: speculative requests that counted
    requests: int
    completion_tokens: int
    #: verify steps (spec_tokens_details only; 0 otherwise)
    verify_ct: int = 0
    accept_length: float | None = None
    method: AcceptMethod = "none"
    exact: bool = True


class Greedy(_Strict):
    """The two servers' answers at concurrency 1 at temperature 0: speculative decoding must
    not change a greedy answer."""

    #: prompts both servers answered at concurrency 1, compared by the same method
    compared: int
    identical: int
    #: "token_ids" (the ids the servers streamed) or "text" (reasoning, content, tool calls)
    method: Literal["token_ids", "text"]
    #: the baseline's completion tokens of the compared answers
    tokens: int
    #: sample ids whose answers differ
    differing: list[str] = Field(default_factory=list)


class Verdict(_Strict):
    """One finding in plain words."""

    severity: Severity
    #: stable machine-readable name (e.g. "draft-not-used", "crossover", "source-low")
    code: str
    text: str


class BenchSettings(_Strict):
    """How the bench was run."""

    concurrency: list[int]
    per_source: int | None
    max_tokens: int
    #: distinct prompts sent per level (cycled until 2 × concurrency requests went out)
    prompts: int
    prompts_file: str | None = None
    run_dir: str | None = None
    #: the sampling sent (temperature, top_p, ...; regen.manifest.Sampling)
    sampling: dict[str, object] = Field(default_factory=dict)
    request_timeout_s: float
    #: the NAME of the environment variable that held the API key (never the key)
    api_key_env: str | None = None


class BenchReport(_Strict):
    """The whole ``bench.json``."""

    schema_version: Literal[1] = SCHEMA_VERSION
    created_at: str
    regen_version: str
    model: str
    settings: BenchSettings
    servers: dict[Literal["baseline", "speculative"], ServerFlags]
    levels: list[LevelResult]
    crossover: Crossover = Field(default_factory=Crossover)
    acceptance: Acceptance = Field(default_factory=Acceptance)
    sources: list[SourceResult] = Field(default_factory=list)
    #: None: not greedy, or no concurrency-1 level
    greedy: Greedy | None = None
    verdicts: list[Verdict] = Field(default_factory=list)

    def source(self, name: str) -> SourceResult:
        for s in self.sources:
            if s.source == name:
                return s
        raise KeyError(name)


def write_report(report: BenchReport, path: str | Path) -> Path:
    """Write ``bench.json`` (indented, temp name then rename)."""
    p = Path(path)
    tmp = p.with_name(f".tmp-{p.name}")
    tmp.write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    tmp.replace(p)
    return p


def read_report(path: str | Path) -> BenchReport:
    """Read and validate a ``bench.json``; another schema version is refused by name."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read {p}: {e.strerror or e}") from None
    except ValueError as e:
        raise ConfigError(f"{p}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: not a bench.json (expected an object)")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ConfigError(
            f"{p}: bench.json schema_version {version!r}; this regen reads {SCHEMA_VERSION}",
            field="schema_version",
        )
    try:
        return BenchReport.model_validate(data)
    except ValidationError as e:
        raise config_error(e, str(p)) from None
