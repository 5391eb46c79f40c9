"""The numbers behind `regen plan`: what a manifest will cost before anything is sent.

Reads every source through :func:`regen.sources.read_samples` (streaming, bounded memory) and
adds, per source: estimated prompt tokens, expected output tokens (the source's
``output_tokens: [low, high]`` per regenerated turn) and the whole job's time band at a given
output throughput. Prompt tokens come from the target tokenizer when ``target.tokenizer`` is an
existing directory (``trust_remote_code`` only when the manifest says so), else from a labelled
``chars/4`` estimate. Owns no files.

Near-duplicates (``dedup.near``) are counted per pair of sources: the source a dropped prompt
came from and the source of the earlier prompt it repeats, with the first three examples of each
pair in ``--json``.

Prompt tokens of a sample count the text a request sends besides the regenerated answers: every
non-assistant message and the tool declarations (JSON). A multi-turn sample resends its history
with every turn; that repetition is not counted here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from regen.core.errors import ConfigError
from regen.core.sample import Sample
from regen.manifest import Dedup, Manifest
from regen.sources import NativeCheck, ReadStats, SourceStats, read_samples, source_set
from regen.sources.native import VocabInfo, validate_native
from regen.sources.neardup import NearReport, lsh_params
from regen.targets import Family
from regen.template.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

#: the seeds' measured output throughput of one Kimi-K2.5 server (tokens per second)
DEFAULT_TOK_PER_S = 830.0
#: characters per token of the labelled fallback estimate
CHARS_PER_TOKEN = 4
#: texts tokenized per tokenizer call
TOKENIZE_BATCH = 256

Counter = Callable[[list[str]], list[int]]


@dataclass(slots=True)
class SourcePlan:
    """One source's line of the plan."""

    name: str
    adapter: str
    mode: str
    limit: int | None
    stats: SourceStats
    prompt_tokens: int = 0
    output_tokens: tuple[int, int] = (0, 0)  #: expected (low, high) for the kept samples

    def to_dict(self) -> dict[str, object]:
        return {
            "adapter": self.adapter,
            "mode": self.mode,
            "limit": self.limit,
            **self.stats.to_dict(),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": list(self.output_tokens),
        }


@dataclass(slots=True)
class PlanReport:
    """The whole job: per-source lines, totals and the time band."""

    name: str
    tok_per_s: float
    token_estimate: str  #: "tokenizer" or "chars/4"
    sources: list[SourcePlan] = field(default_factory=list)
    limits_hours: tuple[float, float] = (0.0, 0.0)  #: band from limits alone (1 turn/sample)
    dedup: Dedup = field(default_factory=Dedup)  #: the manifest's dedup settings
    near: NearReport = field(default_factory=NearReport)  #: near-duplicates by source pair

    def total(self, key: str) -> int:
        return sum(getattr(s.stats, key) for s in self.sources)

    @property
    def output_tokens(self) -> tuple[int, int]:
        return (
            sum(s.output_tokens[0] for s in self.sources),
            sum(s.output_tokens[1] for s in self.sources),
        )

    @property
    def hours(self) -> tuple[float, float]:
        lo, hi = self.output_tokens
        return hours_at(lo, self.tok_per_s), hours_at(hi, self.tok_per_s)

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self.sources)

    def totals(self) -> dict[str, int]:
        """The counts over every source (``to_dict``'s ``total``, less the output tokens)."""
        regen_kept = sum(s.stats.kept for s in self.sources if s.mode == "regenerate")
        native_kept = sum(s.stats.kept for s in self.sources if s.mode == "native")
        return {
            "read": self.total("read"),
            "rejected": self.total("rejected_total"),
            "filtered": self.total("filtered_total"),
            "duplicates": self.total("duplicates"),
            "near_duplicates": self.total("near_duplicates"),
            "kept": self.total("kept"),
            "kept_regenerate": regen_kept,
            "kept_native": native_kept,
            "regenerate_turns": self.total("regenerate_turns"),
            "native_tokens": self.total("native_tokens"),
            "prompt_tokens": self.prompt_tokens,
        }

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "tok_per_s": self.tok_per_s,
            "token_estimate": self.token_estimate,
            "sources": {s.name: s.to_dict() for s in self.sources},
            "total": {**self.totals(), "output_tokens": list(self.output_tokens)},
            "hours": [round(h, 2) for h in self.hours],
            "limits_hours": [round(h, 2) for h in self.limits_hours],
            "near_duplicates": self.near_dict(),
        }

    def near_dict(self) -> dict[str, object]:
        """The dedup settings, the LSH banding they give and the dropped pairs with examples."""
        bands, rows = lsh_params(self.dedup.threshold, self.dedup.num_perm)
        return {
            **self.dedup.model_dump(mode="json"),
            "bands": bands,
            "rows": rows,
            "total": self.near.total,
            "pairs": self.near.to_dict(s.name for s in self.sources),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)


def hours_at(tokens: int, tok_per_s: float) -> float:
    return tokens / tok_per_s / 3600.0


def limits_band(manifest: Manifest, tok_per_s: float) -> tuple[float, float]:
    """Hours for every regenerate source at its limit, one regenerated turn per sample.

    This is how the seeds' case was counted (83,288 prompts at 830 tok/s → 24–55 h); it needs
    no data, so it is known even when the sources cannot be reached.
    """
    lo = hi = 0
    for s in manifest.sources:
        if s.mode == "regenerate" and s.limit is not None:
            lo += s.limit * s.output_tokens[0]
            hi += s.limit * s.output_tokens[1]
    return hours_at(lo, tok_per_s), hours_at(hi, tok_per_s)


def prompt_text(sample: Sample) -> str:
    """The text a sample's requests send besides the answers being regenerated."""
    parts = [m.content for m in sample.messages if m.role != "assistant"]
    if sample.tools:
        parts.append(json.dumps(sample.tools, ensure_ascii=False))
    return "\n".join(parts)


def chars_counter(texts: list[str]) -> list[int]:
    """The labelled fallback: one token per ``CHARS_PER_TOKEN`` characters (rounded up)."""
    return [-(-len(t) // CHARS_PER_TOKEN) for t in texts]


def target_tokenizer(manifest: Manifest) -> PreTrainedTokenizerBase | None:
    """The target tokenizer when ``target.tokenizer`` is an existing directory, else None."""
    path = manifest.resolve(manifest.target.tokenizer)
    if not Path(path).is_dir():
        log.debug("no tokenizer directory at %s: prompt tokens are a chars/4 estimate", path)
        return None
    try:
        return load_tokenizer(path, manifest.target.trust_remote_code)
    except Exception as e:  # transformers raises OSError, ValueError, ImportError, ...
        msg = " ".join(str(e).split())[:200]
        raise ConfigError(
            f"target.tokenizer: cannot load tokenizer from {path}: {msg}", field="target.tokenizer"
        ) from None


def tokenizer_counter(tokenizer: PreTrainedTokenizerBase) -> Counter:
    def count(texts: list[str]) -> list[int]:
        enc = tokenizer(texts, add_special_tokens=False)["input_ids"]
        return [len(ids) for ids in enc]

    return count


def native_check_for(tokenizer: PreTrainedTokenizerBase, family: Family | None) -> NativeCheck:
    """regen.sources.native's vocabulary check of native rows against the target tokenizer (of the
    model ``family``)."""

    vocab = VocabInfo.from_tokenizer(tokenizer, family)
    return lambda sample: validate_native(sample, vocab)


def build_plan(
    manifest: Manifest, tok_per_s: float = DEFAULT_TOK_PER_S, *, row_warnings: bool = True
) -> PlanReport:
    """Read every source and put the numbers together. Raises SourceError on the first
    source that cannot be read, ConfigError when the tokenizer directory does not load.
    ``row_warnings``: log each rejected row (off when the caller prints them, `regen plan`)."""
    if tok_per_s <= 0:
        raise ConfigError("--tok-per-s must be > 0", field="tok_per_s")
    tokenizer = target_tokenizer(manifest)
    counter = tokenizer_counter(tokenizer) if tokenizer is not None else chars_counter
    natives = any(s.mode == "native" for s in manifest.sources)
    native_check = native_check_for(tokenizer, manifest.family()) if tokenizer and natives else None
    plan = PlanReport(
        name=manifest.name,
        tok_per_s=tok_per_s,
        token_estimate="tokenizer" if tokenizer is not None else f"chars/{CHARS_PER_TOKEN}",
        limits_hours=limits_band(manifest, tok_per_s),
        dedup=manifest.dedup,
    )
    stats = ReadStats()
    plan.near = stats.near
    lines = {
        s.name: SourcePlan(s.name, s.adapter, s.mode, s.limit, stats.for_source(s.name))
        for s in manifest.sources
    }
    plan.sources = list(lines.values())
    for name, batch in _batches(read_samples(source_set(manifest), stats, native_check,
                                             row_warnings=row_warnings)):  # fmt: skip
        line = lines[name]
        regen = [s for s in batch if s.mode == "regenerate"]
        if regen:
            line.prompt_tokens += sum(counter([prompt_text(s) for s in regen]))
    for s in manifest.sources:
        turns = lines[s.name].stats.regenerate_turns
        lines[s.name].output_tokens = (turns * s.output_tokens[0], turns * s.output_tokens[1])
    return plan


def _batches(samples: Iterator[Sample]) -> Iterator[tuple[str, list[Sample]]]:
    """Consecutive samples of one source in batches of at most ``TOKENIZE_BATCH``."""
    batch: list[Sample] = []
    for s in samples:
        if batch and (s.source != batch[0].source or len(batch) >= TOKENIZE_BATCH):
            yield batch[0].source, batch
            batch = []
        batch.append(s)
    if batch:
        yield batch[0].source, batch
