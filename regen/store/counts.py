"""The per-source counters: one type, and its arithmetic. Owns no files.

:class:`SourceCounts` is what every file of the run directory that counts samples holds per
source: a part's record (regen.store.layout.PartRecord), a journal line's ``replaces``, the
progress file (regen.store.progress.SourceProgress adds the plan's totals to it), and what
``regen status`` shows (regen.status). :func:`count_rows` makes it from one sample's rows.

They describe each sample's latest answer: a new attempt (``regen run --retry-flagged``)
counts as the difference from the answer it replaces (:func:`net_counts`: ``done`` 0,
``retried`` 1, rows, tokens and flags new minus old), so adding the parts up in any order
gives the totals of the latest answers.

In a file, the first five counters are required; ``flagged``, ``flags``, ``retried``,
``ended``, ``settings``, ``loop_cut``, ``cut_saved``, ``cache_prompt_tokens`` and
``cached_tokens`` (added later) read as 0 (empty) when a file written before them lacks them.
Values are strict: ``"40"`` or ``true`` is not a count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from regen.core import jsontext
from regen.core.result import LOOP


class CountsModel(BaseModel):
    """A record of counters: unknown keys refused, values strict, ``REQUIRED`` keys required
    when read from a file (Python code may leave them at their defaults)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    #: keys a file must hold (its older fields have defaults, the newer ones read as 0)
    REQUIRED: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _required_in_files(cls, data: object, info: ValidationInfo) -> object:
        if info.mode == "json" and isinstance(data, dict):
            cls.check_file(data)
            missing = [k for k in cls.REQUIRED if k not in data]
            if missing:
                raise ValueError(f"missing field {missing[0]!r}")
        return data

    @classmethod
    def check_file(cls, data: Mapping[str, object]) -> None:
        """What a file's data must pass before anything else (raise ValueError)."""


class SourceCounts(CountsModel):
    """Counters of one source over some stored samples (a part, a journal, a whole run)."""

    REQUIRED: ClassVar[tuple[str, ...]] = (
        "done",
        "rows",
        "truncated",
        "prompt_tokens",
        "completion_tokens",
    )

    #: samples
    done: int = 0
    #: training rows (one per regenerated turn)
    rows: int = 0
    #: samples with a ``finish_reason == "length"`` turn
    truncated: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: samples with a row carrying a quality flag (regen.quality)
    flagged: int = 0
    #: rows per quality flag
    flags: dict[str, int] = Field(default_factory=dict)
    #: new attempts stored (samples answered again by regen run --retry-flagged)
    retried: int = 0
    #: samples whose conversation ended early, per reason (the rows' ``ended`` column,
    #: regen.engine.turns: a regenerated tool call that does not match the original's);
    #: written only when some sample ended, so a file without any reads as before it existed
    ended: dict[str, int] = Field(default_factory=dict, exclude_if=lambda v: not v)
    #: samples per settings id of their rows (the rows' ``settings`` column, regen.engine.rows:
    #: ``Manifest.settings_id()`` of the session that answered; native rows and rows written
    #: before the column have none); written only when some sample has one
    settings: dict[str, int] = Field(default_factory=dict, exclude_if=lambda v: not v)
    #: turns regen cut because they looped while streaming (the rows' ``finish_reason``
    #: ``loop``, regen.quality.loop), and the tokens those cuts spared the servers (their
    #: ``cut_saved``); written only when some turn was cut
    loop_cut: int = Field(default=0, exclude_if=lambda v: not v)
    cut_saved: int = Field(default=0, exclude_if=lambda v: not v)
    #: prompt tokens of the rows whose server reported its prefix cache (``cached_tokens`` not
    #: null), and the cached tokens it reported: the source's cache-hit rate is their ratio;
    #: written only when some server reported it
    cache_prompt_tokens: int = Field(default=0, exclude_if=lambda v: not v)
    cached_tokens: int = Field(default=0, exclude_if=lambda v: not v)

    def add(self, other: SourceCounts, sign: int = 1) -> None:
        """Add ``other``'s counters (``sign=-1``: subtract them)."""
        for name in SCALAR_COUNTS:
            setattr(self, name, getattr(self, name) + sign * getattr(other, name))
        for name in MAPPING_COUNTS:
            add_flag_counts(getattr(self, name), getattr(other, name), sign)

    def counts(self) -> SourceCounts:
        """The counters alone (a copy; of a subclass, without what it adds)."""
        values: dict[str, object] = {n: getattr(self, n) for n in SCALAR_COUNTS}
        values.update({n: dict(getattr(self, n)) for n in MAPPING_COUNTS})
        return SourceCounts.model_validate(values)

    def less(self, *others: SourceCounts) -> SourceCounts:
        """The counters less all of ``others``, each clamped at 0 (a flag left at 0 or below
        is dropped): what ``self`` holds beyond them."""
        out = SourceCounts(**{
            n: max(0, getattr(self, n) - sum(getattr(o, n) for o in others)) for n in SCALAR_COUNTS
        })  # fmt: skip
        for name in MAPPING_COUNTS:
            mine, into = getattr(self, name), getattr(out, name)
            theirs = [getattr(o, name) for o in others]
            for key, n in mine.items():
                left = n - sum(t.get(key, 0) for t in theirs)
                if left > 0:
                    into[key] = left
        return out

    @property
    def is_zero(self) -> bool:
        return not any(getattr(self, n) for n in (*SCALAR_COUNTS, *MAPPING_COUNTS))

    @property
    def cache_hit_rate(self) -> float | None:
        """Share of the prompt tokens the servers found in their prefix cache, over the rows
        whose server reported it (None: none did)."""
        if not self.cache_prompt_tokens:
            return None
        return self.cached_tokens / self.cache_prompt_tokens

    @property
    def tokens_per_turn(self) -> float | None:
        """Mean completion tokens per regenerated turn (None before any)."""
        return self.completion_tokens / self.rows if self.rows and self.completion_tokens else None

    @property
    def tokens_per_sample(self) -> float | None:
        """Mean completion tokens per done sample (None before any)."""
        return self.completion_tokens / self.done if self.done and self.completion_tokens else None


#: the integer counters of SourceCounts
SCALAR_COUNTS = tuple(n for n, f in SourceCounts.model_fields.items() if f.annotation is int)
#: its per-key counters: rows per flag, samples per reason their conversation ended, samples
#: per settings id
MAPPING_COUNTS = ("flags", "ended", "settings")


def add_flag_counts(into: dict[str, int], other: dict[str, int], sign: int = 1) -> None:
    """Add per-flag counts (``sign=-1``: subtract); a flag whose count reaches 0 is removed."""
    for flag, n in other.items():
        left = into.get(flag, 0) + sign * n
        if left:
            into[flag] = left
        else:
            into.pop(flag, None)


def count_rows(rows: Iterable[Mapping[str, object]]) -> SourceCounts:
    """The counters of one sample's rows (done = 1)."""
    c = SourceCounts(done=1)
    trunc = False
    for r in rows:
        c.rows += 1
        c.prompt_tokens += _count(r.get("prompt_tokens"))
        c.completion_tokens += _count(r.get("completion_tokens"))
        trunc = trunc or r.get("finish_reason") == "length"
        if r.get("finish_reason") == LOOP:
            c.loop_cut += 1
            c.cut_saved += _count(r.get("cut_saved"))
        if (cached := r.get("cached_tokens")) is not None:
            c.cache_prompt_tokens += _count(r.get("prompt_tokens"))
            c.cached_tokens += _count(cached)
        for flag in jsontext.iterate(r.get("quality_flags") or ()):
            c.flags[str(flag)] = c.flags.get(str(flag), 0) + 1
        if ended := r.get("ended"):
            c.ended[str(ended)] = 1
        if settings := r.get("settings"):
            c.settings[str(settings)] = 1
    c.truncated = int(trunc)
    c.flagged = int(bool(c.flags))
    return c


def net_counts(own: SourceCounts, replaces: SourceCounts | None) -> SourceCounts:
    """A stored sample's counters: its rows' (``own``, from :func:`count_rows`), less those of
    the answer it replaces (a new attempt counts done 0 and retried 1)."""
    if replaces is None:
        return own
    c = own.model_copy(deep=True)
    c.add(replaces, -1)
    c.retried += 1
    return c


def output_tokens(rows: Iterable[Mapping[str, object]]) -> list[int]:
    """Completion tokens of the regenerated rows (native rows are not answers of the server)."""
    return [_count(r.get("completion_tokens")) for r in rows
            if r.get("token_source") != "native"]  # fmt: skip


def _count(value: object) -> int:
    """A row's count column as an int (null: 0; TypeError for a value that is no number)."""
    if not value:
        return 0
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"a count is a number, not {type(value).__name__}")
