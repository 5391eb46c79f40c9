"""The thresholds of the quality checks: a strict config, also the manifest's ``quality:``
section (not part of the fingerprint: it decides flags, never which samples a run holds).
Owns no files; imports nothing heavy (the manifest imports it)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from regen.core.errors import ConfigError

#: every flag, in the order a row lists them (docs/quality.md)
FLAGS = (
    "repetition",
    "empty_content",
    "reasoning_unclosed",
    "language_mismatch",
    "refusal",
    "bad_tool_call",
    "collapsed",
)
#: what ``regen export`` drops unless told otherwise: answers that teach the draft garbage. A
#: refusal is the target's real behaviour at serving time (short, and worth drafting), so it is
#: kept by default; ``--drop-flags all`` drops it too. ``collapsed`` (one answer given to many
#: different prompts, found at export: regen.quality.collapse) would teach the draft one fixed
#: reply, so it is dropped by default
DEFAULT_DROP_FLAGS = (
    "repetition",
    "empty_content",
    "reasoning_unclosed",
    "language_mismatch",
    "bad_tool_call",
    "collapsed",
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


class LoopCut(BaseModel):
    """Cutting an answer that loops while it streams (:mod:`regen.quality.loop`): every
    ``every`` streamed tokens the last ``window_words`` words of the answer are measured
    (:func:`regen.quality.repetition.longest_repeat`); a back-to-back run of one n-gram of at
    least ``min_words`` words in at least ``min_copies`` copies closes the stream. A run
    records the settings it started with (run.json) and resumes with them."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    #: cut looping answers while they stream (False: only flag them once they end)
    enabled: bool = True
    #: streamed tokens between two looks at the answer
    every: int = Field(default=128, ge=1, le=4096)
    #: words of the answer's tail each look measures
    window_words: int = Field(default=400, ge=8, le=8192)
    #: a back-to-back run must cover this many words of the window ...
    min_words: int = Field(default=200, ge=4)
    #: ... in at least this many copies of its n-gram
    min_copies: int = Field(default=4, ge=2)

    @model_validator(mode="after")
    def _fits(self) -> LoopCut:
        if self.min_words > self.window_words:
            raise ValueError(
                f"loop_cut.min_words ({self.min_words}) is more than the window it is looked "
                f"for in (loop_cut.window_words {self.window_words})"
            )
        return self


#: what a run directory made before the cut existed records: no cut
NO_LOOP_CUT = LoopCut(enabled=False)


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
    #: cut looping answers while they stream (:class:`LoopCut`)
    loop_cut: LoopCut = LoopCut()
    #: collapsed (at export, across the rows of a source: regen.quality.collapse): an answer
    #: is flagged when this many distinct prompts of its source got it (exactly, or near)
    collapse_min_prompts: int = Field(default=8, ge=2)
    #: ... counted only for answers (reasoning, content and tool calls) of at least this many
    #: words: real sources share short answers ("Sure!", a bare tool call) on purpose
    collapse_min_words: int = Field(default=16, ge=1)
    #: ... where two answers are the same when the estimated Jaccard similarity of their word
    #: 3-shingles reaches this (1.0: only exact copies; words normalized as in near-dup)
    collapse_similarity: float = Field(default=0.8, ge=0.5, le=1.0)


DEFAULT_CONFIG = QualityConfig()
