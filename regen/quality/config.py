"""The thresholds of the quality checks: a strict config, also the manifest's ``quality:``
section (not part of the fingerprint: it decides flags, never which samples a run holds).
Owns no files; imports nothing heavy (the manifest imports it)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from regen.core.errors import ConfigError

#: every flag, in the order a row lists them (docs/quality.md)
FLAGS = (
    "repetition",
    "empty_content",
    "reasoning_unclosed",
    "language_mismatch",
    "refusal",
    "bad_tool_call",
)
#: what ``regen export`` drops unless told otherwise: answers that teach the draft garbage. A
#: refusal is the target's real behaviour at serving time (short, and worth drafting), so it is
#: kept by default; ``--drop-flags all`` drops it too
DEFAULT_DROP_FLAGS = (
    "repetition",
    "empty_content",
    "reasoning_unclosed",
    "language_mismatch",
    "bad_tool_call",
)


def parse_flags(value: str | Iterable[str], what: str = "flags") -> tuple[str, ...]:
    """Flags from a comma list or a sequence, in :data:`FLAGS` order: ``default`` is
    :data:`DEFAULT_DROP_FLAGS`, ``all`` every flag, ``none`` (or empty) no flag. An unknown name
    is a ConfigError naming it and the known ones."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names = {str(x).strip().lower() for x in items} - {""}
    if names <= {"none"}:
        return ()
    out: set[str] = set()
    for name in names:
        if name == "all":
            out |= set(FLAGS)
        elif name == "default":
            out |= set(DEFAULT_DROP_FLAGS)
        elif name in FLAGS:
            out.add(name)
        else:
            raise ConfigError(
                f"{what}: unknown flag {name!r} (known: {', '.join(FLAGS)}, or all, default, none)",
                field=what,
            )
    return tuple(f for f in FLAGS if f in out)


class QualityConfig(BaseModel):
    """Thresholds of the checks (defaults measured in docs/quality.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: longest n-gram looked for in a back-to-back repetition
    repeat_max_ngram: int = Field(default=64, ge=1, le=512)
    #: repetition: words a back-to-back run must cover in an answer cut at max_tokens
    repeat_min_words: int = Field(default=48, ge=2)
    #: repetition: words a back-to-back run must cover in an answer that stopped by itself
    repeat_min_words_stopped: int = Field(default=200, ge=2)
    #: repetition: copies of the n-gram the run must hold
    repeat_min_copies: int = Field(default=3, ge=2)
    #: repetition: zlib ratio (compressed / raw bytes) below which an answer repeats itself
    compression_max: float = Field(default=0.08, gt=0, le=1)
    #: ... counted only for answers of at least this many UTF-8 bytes
    compression_min_bytes: int = Field(default=2048, ge=1)
    #: letters (a CJK character counts 3) a prompt and an answer need to have their scripts compared
    script_min_letters: float = Field(default=24, gt=0)
    #: language_mismatch when less than this share of the answer's letters is in the prompt's script
    script_max_share: float = Field(default=0.25, gt=0, le=1)
    #: characters at the opening of the content searched for a refusal phrase
    refusal_window: int = Field(default=160, ge=1)


DEFAULT_CONFIG = QualityConfig()
