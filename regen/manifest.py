"""The manifest: one strict YAML file that says what to regenerate, with what, and how.

Every model rejects unknown keys. Paths in a manifest are relative to the manifest's folder.
Dotted CLI overrides (``-o sampling.temperature=0``) are applied to the raw mapping and then
validated by the same models, so they fail exactly like a bad file would.
"""

from __future__ import annotations

import difflib
import json
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, cast
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from regen.core.errors import ConfigError
from regen.core.sample import stable_hash
from regen.quality.config import DEFAULT_DROP_FLAGS, QualityConfig, parse_flags
from regen.targets import FIRST_FAMILY, UNKNOWN, Family, valid_name
from regen.targets.decide import decide_family

#: the source adapters, by the name a manifest gives (regen.sources.adapters: each one's parser)
AdapterName = Literal[
    "sharegpt",
    "ultrachat",
    "openthoughts",
    "perfectblend",
    "opencodereasoning",
    "xlam",
    "glaive",
    "swe_gym",
    "magicoder",
    "kimi_native",
]
ADAPTERS: tuple[AdapterName, ...] = typing.get_args(AdapterName)
#: the adapters of pre-tokenized rows: a source in mode ``native`` uses one, and only such a source
NATIVE_ADAPTERS: frozenset[AdapterName] = frozenset({"kimi_native"})
#: hex characters of :meth:`Manifest.settings_id`
SETTINGS_ID_CHARS = 8


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Target(Strict):
    """The target model, as served and as tokenized."""

    #: the model name the endpoints serve (checked against /v1/models)
    model: str = Field(min_length=1)
    #: local directory holding the target's tokenizer and chat template
    tokenizer: str = Field(min_length=1)
    #: template flavour recorded in the fingerprint (e.g. "kimi-k2.5"); the tokenizer's own
    #: chat template is what renders, unless chat_template names another
    template: str = "kimi-k2.5"
    #: the chat template file the servers run with (their --chat-template), relative to the
    #: manifest; unset: the tokenizer's own. A family whose published template cannot take what
    #: the engines hand it (DeepSeek-V3.1: tool-call arguments as objects) is served with a
    #: fixed one, and the local render must use the same (docs/targets.md)
    chat_template: str | None = None
    #: allow the tokenizer directory's own Python code (Kimi's tiktoken tokenizer needs it)
    trust_remote_code: bool = False
    #: the model family (docs/targets.md: kimi, qwen3, ...; "unknown": none regen knows, server
    #: ids only); unset: recognised from the tokenizer. `regen run` records what it found
    family: str | None = None

    _family = field_validator("family")(valid_name)


class Sampling(Strict):
    """How the target answers. Part of the fingerprint."""

    #: sampling temperature
    temperature: float = Field(default=0.6, ge=0.0, le=2.0)
    #: nucleus sampling
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    #: top-k (SGLang extra; -1 or None disables)
    top_k: int | None = None
    #: maximum completion tokens per turn
    max_tokens: int = Field(default=4096, gt=0)
    #: thinking on or off (sent as the target family's chat-template switch, docs/targets.md:
    #: Kimi's chat_template_kwargs.thinking, Qwen3's enable_thinking, ...), or an effort level
    #: of a family whose thinking takes one (Kimi K3: low, high, max; GPT-OSS: low, medium,
    #: high; ...; true asks for the family's default level)
    thinking: bool | str = True
    #: extra chat_template_kwargs sent to the server and used for the local render (they win
    #: over the thinking switch)
    chat_template_kwargs: dict[str, object] = Field(default_factory=dict)
    #: where a row's token ids come from. "stream" (default): the server's exact ids, streamed
    #: (SGLang's sglext: return_input_ids_in_sglext / return_output_ids_in_sglext; streaming
    #: keeps the time-to-first-token signal adaptive concurrency uses). "nonstream": the
    #: server's exact ids in one JSON answer (SGLang return_prompt_token_ids /
    #: return_token_ids; no TTFT). "local": rendered and tokenized here (token_check flags
    #: what cannot be proven equal). vLLM gives its ids with return_token_ids both ways; a server
    #: of no known engine (neither SGLang's /server_info nor vLLM's /version and metrics) gets
    #: the local render whatever this says (docs/format.md, docs/engines.md).
    token_ids: Literal["stream", "nonstream", "local"] = "stream"
    #: sampling seed sent to the server (None: let the server choose). SGLang uses it only when
    #: the server runs with --enable-deterministic-inference; `regen run` warns otherwise
    seed: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _old_server_token_ids(cls, data: object) -> object:
        """``server_token_ids: true/false`` (before token_ids existed) → nonstream / local."""
        if isinstance(data, dict) and "server_token_ids" in data and "token_ids" not in data:
            data = dict(data)
            data["token_ids"] = "nonstream" if data.pop("server_token_ids") else "local"
        return data


class Endpoint(Strict):
    """One OpenAI-compatible server. The API key never lives in the manifest."""

    #: base URL including /v1, e.g. http://10.0.0.5:30000/v1
    url: str = Field(min_length=1)
    #: environment variable holding the API key
    api_key_env: str | None = None
    #: file holding the API key (relative to the manifest)
    api_key_file: str | None = None
    #: relative share of traffic when routing
    weight: float = Field(default=1.0, gt=0)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")


def public_url(url: str) -> str:
    """``url`` without user:password: the only form of an endpoint URL regen writes or logs."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


class Engine(Strict):
    """How hard to push. Not part of the fingerprint: change freely between resumes."""

    #: Ray actors issuing requests
    workers: int = Field(default=2, ge=1)
    #: a hard upper bound on the requests in flight per actor; unset (the default): automatic,
    #: each actor starts at its share of the server's slots (+1/8) and adapts, or 64 when a
    #: server reports no max_running_requests (docs/performance.md)
    concurrency: int | None = Field(default=None, ge=1)
    #: attempts per request before the sample is left for the next run
    max_attempts: int = Field(default=8, ge=1)
    #: first backoff delay, seconds
    backoff_initial_s: float = Field(default=1.0, gt=0)
    #: backoff cap, seconds
    backoff_max_s: float = Field(default=60.0, gt=0)
    #: per-request timeout, seconds: the longest one answer may take in all
    request_timeout_s: float = Field(default=1800.0, gt=0)
    #: seconds a stream may send nothing before it is cancelled as stalled and its sample is
    #: retried on another endpoint (an endpoint whose streams stall together leaves rotation);
    #: unset (the default): derived per endpoint from the gaps its streams have shown, never
    #: below stall_min_s (regen.engine.stall)
    stall_timeout_s: float | None = Field(default=None, gt=0)
    #: the floor of the derived stall timeout, seconds
    stall_min_s: float = Field(default=30.0, gt=0)
    #: consecutive failures that take an endpoint out of rotation
    endpoint_failure_threshold: int = Field(default=5, ge=1)
    #: seconds between probes of an endpoint out of rotation
    endpoint_probe_interval_s: float = Field(default=15.0, gt=0)
    #: read each endpoint's /metrics page (SGLang with --enable-metrics, vLLM) and schedule by
    #: what the server says (docs/metrics.md); false: by regen's own counts and the 503s only
    server_metrics: bool = True
    #: completed samples buffered before a Parquet part is written
    part_size: int = Field(default=256, ge=1)
    #: seconds after which a non-empty buffer is written as a part anyway
    part_interval_s: float = Field(default=30.0, gt=0)
    #: seconds a full disk (ENOSPC, EDQUOT) under the run directory may last: the session
    #: keeps the answers in memory and retries its writes (0.25 s, up to 1 s apart) until space
    #: returns; past this it stops (exit 2) and a rerun resumes. 0: stop at once
    disk_full_wait_s: float = Field(default=300.0, ge=0)


class HubRef(Strict):
    """A Hugging Face hub dataset."""

    #: dataset id, e.g. "Aeala/ShareGPT_Vicuna_unfiltered"
    id: str = Field(min_length=1)
    #: dataset config name
    config: str | None = None
    #: split
    split: str = "train"
    #: git revision (pin it for reproducible runs)
    revision: str | None = None


class Filters(Strict):
    """Row filters applied after the adapter."""

    #: drop samples whose non-assistant text exceeds this many characters
    max_prompt_chars: int | None = Field(default=None, gt=0)
    #: drop samples whose non-assistant text is shorter than this
    min_prompt_chars: int = Field(default=1, ge=0)
    #: drop samples with more assistant turns than this
    max_turns: int | None = Field(default=None, gt=0)


class Source(Strict):
    """One input dataset."""

    #: unique name; prefixes every sample id of this source
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    #: row-shape adapter
    adapter: AdapterName
    #: a hub dataset ...
    hub: HubRef | None = None
    #: ... or a local JSONL / Parquet file (relative to the manifest)
    path: str | None = None
    #: keep at most this many samples (after filters and dedup); None keeps all
    limit: int | None = Field(default=None, ge=0)
    #: regenerate the answers, or pass pre-tokenized rows through
    mode: Literal["regenerate", "native"] = "regenerate"
    #: which assistant turns to regenerate
    turns: Literal["all", "last"] = "all"
    #: row filters
    filters: Filters = Field(default_factory=Filters)
    #: planning assumption: output tokens per regenerated turn, low and high
    output_tokens: tuple[int, int] = (600, 1400)

    @model_validator(mode="after")
    def _check(self) -> Source:
        if (self.hub is None) == (self.path is None):
            raise ValueError("give exactly one of 'hub' or 'path'")
        if (self.mode == "native") != (self.adapter in NATIVE_ADAPTERS):
            names = " or ".join(repr(a) for a in sorted(NATIVE_ADAPTERS))
            raise ValueError(f"mode 'native' goes with adapter {names} (and only with it)")
        lo, hi = self.output_tokens
        if not 0 < lo <= hi:
            raise ValueError("output_tokens must be [low, high] with 0 < low <= high")
        return self


class Dedup(Strict):
    """Duplicate prompts. Exact duplicates are always dropped; this adds near-duplicates.
    Part of the fingerprint (it decides which samples a run holds)."""

    #: drop near-duplicate prompts (MinHash + LSH over the normalized prompt text; the first
    #: occurrence in manifest order wins)
    near: bool = True
    #: estimated Jaccard similarity of the prompts' word shingles at or above which the later
    #: prompt is dropped
    threshold: float = Field(default=0.85, ge=0.5, le=1.0)
    #: words per shingle
    shingle: int = Field(default=5, ge=1, le=32)
    #: MinHash permutations per signature (more: a finer estimate, more memory)
    num_perm: int = Field(default=128, ge=32, le=1024)


def flag_names(value: object) -> list[str]:
    """Quality flag names from a list or a comma string of names, ``all``, ``default`` or
    ``none`` (regen.quality.parse_flags; ValueError naming the unknown one)."""
    try:
        items = value if isinstance(value, str) else list(cast(Iterable[str], value or []))
        return list(parse_flags(items, "drop_flags"))
    except (ConfigError, TypeError) as e:
        raise ValueError(str(e)) from None


#: quality flag names, given as a list or a comma string (:func:`flag_names`)
FlagNames = Annotated[list[str], BeforeValidator(flag_names)]


class Export(Strict):
    """What an export keeps and how it writes it: the manifest's ``export:`` section.

    The one model of these fields: regen.store.layout.ExportChoices adds one export's own
    choices (stats.json records both), regen.export.settings.ExportSettings what it decides
    with besides, train.yaml's ``export:`` sets any of them (regen.train.config.ExportSpec, the
    same fields optional) and ``regen export``'s flags are named after them."""

    #: drop rows whose finish_reason is "length"
    drop_truncated: bool = True
    #: drop rows longer than this many tokens (None keeps all; ``regen train``:
    #: ``training.max_length``, regen.train.config.TrainConfig.export_max_length)
    max_length: int | None = Field(default=None, gt=0)
    #: shuffle seed
    seed: int = 0
    #: rows per JSONL shard (0: one shard, what SpecForge's ``data.prompts_path`` reads)
    shard_rows: int = Field(default=10_000, ge=0)
    #: samples per source kept out of the shards for `regen bench` (holdout.jsonl); 0: none
    holdout: int = Field(default=0, ge=0)
    #: drop rows carrying any of these quality flags (docs/quality.md; [] keeps every row)
    drop_flags: FlagNames = Field(default_factory=lambda: list(DEFAULT_DROP_FLAGS))
    #: keep locally rendered rows whose token_check cannot show they are the model's tokens
    #: (count_mismatch, tool_calls_rebuilt, count_unknown, think_inserted, content_has_think;
    #: docs/format.md); by default export drops them
    keep_unproven: bool = False


class Manifest(Strict):
    """A whole regeneration job."""

    #: run name shown in the dashboard
    name: str = Field(min_length=1)
    target: Target
    sampling: Sampling = Field(default_factory=Sampling)
    #: OpenAI-compatible servers; `regen run --endpoint` replaces this list
    endpoints: list[Endpoint] = Field(default_factory=list)
    engine: Engine = Field(default_factory=Engine)
    sources: list[Source] = Field(min_length=1)
    #: exact and near-duplicate prompts
    dedup: Dedup = Field(default_factory=Dedup)
    export: Export = Field(default_factory=Export)
    #: thresholds of the quality checks run on every regenerated turn (docs/quality.md); not
    #: part of the fingerprint: they decide flags, never which samples a run holds
    quality: QualityConfig = Field(default_factory=QualityConfig)
    #: folder the manifest was loaded from (relative paths resolve against it); set by load
    base_dir: str = "."

    @field_validator("sources")
    @classmethod
    def _unique_names(cls, v: list[Source]) -> list[Source]:
        seen: set[str] = set()
        for s in v:
            if s.name in seen:
                raise ValueError(f"duplicate source name {s.name!r}")
            seen.add(s.name)
        return v

    def resolve(self, path: str) -> Path:
        """A manifest-relative path made absolute."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()

    def source(self, name: str) -> Source:
        for s in self.sources:
            if s.name == name:
                return s
        raise KeyError(name)

    def family(self) -> Family | None:
        """The target's model family (regen.targets.decide: what its tokenizer directory shows,
        which ``target.family`` must not contradict, else ``target.family``; None: no family
        regen knows)."""
        return decide_family(self.target.family, self.resolve(self.target.tokenizer))

    def served_template(self) -> str | None:
        """The text of ``target.chat_template`` (None: unset); ConfigError when it is not a
        readable file."""
        if self.target.chat_template is None:
            return None
        path = self.resolve(self.target.chat_template)
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"target.chat_template: cannot read {path}: {e}",
                              field="target.chat_template") from None  # fmt: skip

    def with_family(self) -> Manifest:
        """This manifest with ``target.family`` set to what :meth:`family` finds (a run records
        the family it ran with)."""
        if self.target.family is not None:
            return self
        fam = self.family()
        target = self.target.model_copy(update={"family": fam.name if fam else UNKNOWN})
        return self.model_copy(update={"target": target})

    def request_fields(self) -> dict[str, object]:
        """Top-level request fields of the family's thinking switch (besides the template
        kwargs; GPT-OSS's ``reasoning_effort``); {} for most families."""
        fam = self.family()
        return fam.request_fields(self._thinking(fam)) if fam is not None else {}

    def template_kwargs(self) -> dict[str, object]:
        """The ``chat_template_kwargs`` of every request and of the local render: the family's
        thinking switch, then ``sampling.chat_template_kwargs``."""
        fam = self.family()
        switch = fam.template_kwargs(self._thinking(fam)) if fam is not None else {}
        return {**switch, **self.sampling.chat_template_kwargs}

    def _thinking(self, fam: Family | None) -> bool | str:
        """``sampling.thinking``, checked against the family's effort levels (ConfigError)."""
        thinking = self.sampling.thinking
        try:
            if fam is not None:
                fam.effort(thinking)
            elif isinstance(thinking, str):
                raise ValueError("an effort level needs a family that takes one; the target's "
                                 "family is unknown")  # fmt: skip
        except ValueError as e:
            raise ConfigError(f"sampling.thinking: {e}", field="sampling.thinking") from None
        return thinking

    def fingerprint(self) -> str:
        """What must not change under a resumed run: sources, dedup, model, sampling, template.
        ``dedup`` counts while ``dedup.near`` is on (it decides which samples a run holds); with
        it off the fingerprint is the one a manifest had before near-duplicate detection."""
        return stable_hash(self.fingerprint_payload(), n=32)

    def fingerprint_payload(self) -> dict[str, object]:
        """What :meth:`fingerprint` hashes (:func:`flat_fields` names each value)."""
        payload: dict[str, object] = {
            **self.settings_payload(),
            "sources": [s.model_dump(mode="json") for s in self.sources],
        }
        if self.dedup.near:
            payload["dedup"] = self.dedup.model_dump(mode="json")
        return payload

    def settings_payload(self) -> dict[str, object]:
        """The settings that make an answer: the target (model, tokenizer, template, family) and
        the sampling. Not the sources: they decide which samples a run holds, not how each is
        answered."""
        target = self.target.model_dump(mode="json")
        del target["family"]
        if target["chat_template"] is None:  # unset: the payload of before the field existed
            del target["chat_template"]
        # the family counts where it assembles rows other than a run made before families
        # (all Kimi) did: a Kimi target, or one of no known family (its rows are the server's
        # ids), keeps the payload it had then, so such runs resume
        fam = self.family()
        if fam is not None and fam.name != FIRST_FAMILY:
            target["family"] = fam.name
        return {"target": target, "sampling": self.sampling.model_dump(mode="json")}

    def settings_id(self) -> str:
        """A short id of :meth:`settings_payload`: what every regenerated row records in its
        ``settings`` column (regen.engine.rows), so that rows made under other settings (``regen run
        --force``) can be told apart and filtered (``regen export --setting ID``)."""
        return stable_hash(self.settings_payload(), n=SETTINGS_ID_CHARS)

    def to_yaml(self) -> str:
        data = self.model_dump(mode="json", exclude={"base_dir"})
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def flat_fields(payload: Mapping[str, object]) -> dict[str, object]:
    """A fingerprint or settings payload as ``{dotted field: value}``: ``sampling.temperature``,
    ``target.model``, ``sources.sharegpt.limit`` (sources by name), ``dedup.threshold``."""
    out: dict[str, object] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = value

    for key, value in payload.items():
        if key == "sources" and isinstance(value, list):
            for i, s in enumerate(value):
                name = s.get("name", i) if isinstance(s, dict) else i
                walk(f"sources.{name}", s)
        else:
            walk(key, value)
    return out


def changed_fields(
    old: Mapping[str, object], new: Mapping[str, object]
) -> list[tuple[str, object, object]]:
    """``(field, old value, new value)`` of every field two payloads disagree on (a field one
    lacks reads as None), in the order of the new payload's fields, then the old one's."""
    a, b = flat_fields(old), flat_fields(new)
    names = [*b, *(k for k in a if k not in b)]
    return [(k, a.get(k), b.get(k)) for k in names if a.get(k) != b.get(k)]


def apply_overrides(data: dict[str, object], overrides: list[str]) -> dict[str, object]:
    """Apply ``key.sub=value`` overrides to a raw mapping. Values parse as YAML scalars.

    List elements are addressed by index (``sources.0.limit=10``) or, for ``sources``, by
    name (``sources.sharegpt.limit=10``). An override without ``=`` is an overlay file: a
    YAML mapping merged into the manifest, its keys addressed the same way
    (``sources: {sharegpt: {limit: 10}}``), e.g. what ``regen plan --reweight`` writes.
    """
    for item in overrides:
        if "=" not in item:
            _merge_overlay(data, _read_overlay(item), "")
            continue
        key, raw = item.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError(f"override {item!r} has an empty key", field=item)
        value = load_yaml(raw, f"override {key!r}", field=key) if raw.strip() else ""
        node: object = data
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                idx = _list_index(node, part, key)
                if last:
                    node[idx] = value
                else:
                    node = node[idx]
            elif isinstance(node, dict):
                if last:
                    node[part] = value
                else:
                    node = node.setdefault(part, {})
            else:
                raise ConfigError(f"override {key!r}: {part!r} is not inside a mapping", field=key)
    return data


def read_yaml_file(path: str | Path, what: str, *, field: str | None = None) -> Any:
    """The YAML (or JSON) document of a config file; a ConfigError naming ``what`` and the path
    when it cannot be read or parsed."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or e
        raise ConfigError(f"cannot read {what} {str(p)!r}: {why}", field=field) from None
    return load_yaml(text, f"{what} {p}", field=field)


#: this PyYAML was built with libyaml (its C parser)
_LIBYAML: bool = bool(getattr(yaml, "__with_libyaml__", False))


def load_yaml(text: str, what: str, *, field: str | None = None) -> Any:
    """``yaml.safe_load(text)``, by libyaml's parser where PyYAML has it (``CSafeLoader``, the
    same safe constructor: manifests/demo.yaml in 1.2 ms of CPU instead of 8.7, 2026-12-07);
    one ConfigError line naming ``what`` when it is not YAML."""
    try:
        if _LIBYAML:
            return yaml.load(text, Loader=yaml.CSafeLoader)
        return yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError) as e:
        # PyYAML's messages span lines (the problem, then where); a date that is no date
        # (2001-02-30) is its ValueError, text nested too deeply a RecursionError
        why = " ".join(str(e).split()) or type(e).__name__
        raise ConfigError(f"{what}: not valid YAML: {why}", field=field) from None


def _read_overlay(path: str) -> dict[object, object]:
    if not Path(path).is_file():
        raise ConfigError(f"override {path!r} is neither key=value nor a YAML file", field=path)
    overlay = read_yaml_file(path, "overlay", field=path)
    if not isinstance(overlay, dict):
        raise ConfigError(f"overlay {path}: expected a mapping at top level", field=path)
    return overlay


def _merge_overlay(node: object, overlay: Mapping[object, object], where: str) -> None:
    """Merge a mapping into ``node``: mappings merge, anything else replaces."""
    for raw_key, value in overlay.items():
        key = str(raw_key)
        path = f"{where}{key}"
        if isinstance(node, list):
            i = _list_index(node, key, path)
            if not _merged(node[i], value, path):
                node[i] = value
        elif isinstance(node, dict):
            if not _merged(node.get(key), value, path):
                node[key] = value
        else:
            raise ConfigError(f"overlay {path!r}: {key!r} is not inside a mapping", field=path)


def _merged(child: object, value: object, path: str) -> bool:
    """Whether ``value``, a mapping, was merged into ``child``, a mapping or list (False: it
    replaces ``child``)."""
    if isinstance(value, dict) and isinstance(child, dict | list):
        _merge_overlay(child, value, f"{path}.")
        return True
    return False


def _list_index(node: list[object], part: str, key: str) -> int:
    if part.isdigit() and int(part) < len(node):
        return int(part)
    for i, el in enumerate(node):
        if isinstance(el, dict) and el.get("name") == part:
            return i
    raise ConfigError(f"override {key!r}: no list element {part!r}", field=key)


def parse_manifest(
    data: object, *, base_dir: str | Path = ".", origin: str = "manifest"
) -> Manifest:
    """Validate a raw mapping; a failure becomes one ConfigError naming the first bad field."""
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping at top level, got {type(data).__name__}")
    data = {**data, "base_dir": str(base_dir)}
    try:
        return Manifest.model_validate(data)
    except ValidationError as e:
        raise config_error(e, origin, data, Manifest) from None


def load_manifest(path: str | Path, overrides: list[str] | None = None) -> Manifest:
    """Load, override and validate a manifest file.

    Source files are not opened here: regen.sources reports a missing file (or an unreachable
    hub id) as a SourceError naming the source and its field, in manifest order.
    """
    p = Path(path)
    data = read_yaml_file(p, "manifest")
    if isinstance(data, dict) and overrides:
        data = apply_overrides(data, overrides)
    return parse_manifest(data, base_dir=p.resolve().parent, origin=str(p))


def config_error(
    e: ValidationError,
    origin: str,
    data: Mapping[str, object] | None = None,
    model: type[BaseModel] | None = None,
) -> ConfigError:
    """One ConfigError for a pydantic failure: ``origin: dotted.field: message``. An unknown
    key is reported first, whatever pydantic's order (a misspelt key also makes the real one
    "missing": the cause goes first), with the closest valid name at its place (the fields of
    ``model`` there, and the keys missing beside it). ``data``, the raw mapping, names the
    source of a ``sources.N`` field."""
    errors = e.errors()
    err = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc = [str(x) for x in err["loc"]]
    # pydantic puts the union/literal tag in the location; keep only real path parts (a key
    # that is not printable text, a line break or a lone surrogate in it, shown as JSON)
    path = ".".join(x if x.isprintable() else json.dumps(x)
                    for x in loc if not x.startswith(("function-", "literal[")))  # fmt: skip
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key (not allowed here)" + _closest(err["loc"], errors, model)
    where = path or "(top level)"
    hint = _source_hint(loc, data)
    inp = err.get("input")
    shown = ""
    if err["type"] not in ("extra_forbidden", "missing") and not isinstance(inp, dict | list):
        shown = f" (got {json.dumps(inp, default=str)[:80]})"
    extra = f" [{len(e.errors()) - 1} more error(s)]" if len(e.errors()) > 1 else ""
    return ConfigError(f"{origin}: {where}{hint}: {msg}{shown}{extra}", field=path or None)


def _closest(
    loc: tuple[int | str, ...], errors: list[ErrorDetails], model: type[BaseModel] | None
) -> str:
    """``; did you mean 'adapter'?`` for an unknown key at ``loc`` ("" when nothing is close)."""

    parent = tuple(loc[:-1])
    valid = {str(x["loc"][-1]) for x in errors
             if x["type"] == "missing" and tuple(x["loc"][:-1]) == parent}  # fmt: skip
    valid |= set(_fields_at(model, parent))
    near = difflib.get_close_matches(str(loc[-1]), sorted(valid), n=1, cutoff=0.6)
    return f"; did you mean {near[0]!r}?" if near else ""


def _fields_at(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the pydantic model found at ``loc`` under ``model`` (lists and
    optionals followed), or [] when there is none."""
    node: object = model
    for part in loc:
        found = _model_of(node)
        if found is None:
            return []
        if isinstance(part, int):
            continue  # the list's item type was taken by _model_of
        field = found.model_fields.get(str(part))
        if field is None:
            return []
        node = field.annotation
    found = _model_of(node)
    return list(found.model_fields) if found is not None else []


def _model_of(annotation: object) -> type[BaseModel] | None:
    """The pydantic model in ``annotation`` (itself, a list's items, an Optional's arm)."""

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _source_hint(loc: list[str], data: Mapping[str, object] | None) -> str:
    if data is not None and len(loc) >= 2 and loc[0] == "sources" and loc[1].isdigit():
        sources = data.get("sources")
        try:
            source = sources[int(loc[1])] if isinstance(sources, list) else None
        except IndexError:
            return ""
        name = source.get("name") if isinstance(source, dict) else None
        return f" (source {name!r})" if name else ""
    return ""
