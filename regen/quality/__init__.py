"""Quality checks of one regenerated turn: cheap, deterministic, no model (docs/quality.md).

:func:`check_turn` takes what one regenerated turn has — the request's messages and tools, and
the answer's reasoning, content, tool calls and ``finish_reason`` — and returns a
:class:`Quality`: ``flags`` (names from :data:`FLAGS`) plus the measures behind them, shaped as
row columns (:data:`COLUMNS` of :mod:`.columns`, :meth:`Quality.columns`). :func:`check_row` does
the same for a row dict of :mod:`regen.engine.rows` (JSON columns as stored). Thresholds live in
:class:`QualityConfig` (:mod:`.config`, the manifest's ``quality:`` section); their defaults were
chosen on measured corpora (docs/quality.md).

Flags:

- ``repetition``: the longest back-to-back run of one n-gram (:mod:`.repetition`) covers at
  least ``repeat_min_words`` words in ``repeat_min_copies`` or more copies (``repeat_min_words
  _stopped`` when the answer stopped by itself), or the answer compresses below
  ``compression_max`` while at least ``compression_min_bytes`` long. Reasoning and content are
  measured together. A turn regen cut while it streamed because it looped (``finish_reason``
  ``loop``, :mod:`.loop`) always carries it.
- ``empty_content``: the answer stopped by itself (not ``length``) with no content and no tool
  call — thinking closed (or never started) and nothing followed.
- ``reasoning_unclosed``: the answer is all reasoning — no content, no tool call — and either ran
  into ``max_tokens`` or is known not to hold ``</think>`` (``think_closed=False``).
- ``language_mismatch``: the content is in another script than the prompt (:mod:`.script`).
- ``refusal``: the content opens with a refusal phrase (:mod:`.refusal`).
- ``bad_tool_call``: a tool call does not fit the declared tools (:mod:`.tools`).
- ``collapsed``: not a check of one turn: one answer given to many different prompts of a
  source, found across rows by ``regen export`` (:mod:`.collapse`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from regen.core.result import LOOP, UNFINISHED
from regen.quality.config import (
    DEFAULT_CONFIG,
    DEFAULT_DROP_FLAGS,
    FLAGS,
    QualityConfig,
    parse_flags,
)
from regen.quality.refusal import REFUSAL_PHRASES, refusal_phrase
from regen.quality.repetition import compression_ratio, longest_repeat
from regen.quality.script import ScriptCheck, script_mismatch
from regen.quality.tools import call_problem, declared


@dataclass(slots=True, frozen=True)
class Quality:
    """The flags of one turn and the measures behind them (:data:`COLUMNS`)."""

    flags: tuple[str, ...]  #: names from FLAGS, in FLAGS order
    repeat_words: int  #: words in the longest back-to-back repetition of one n-gram
    repeat_ngram: int  #: the size of that n-gram (0: none)
    compression: float | None  #: zlib ratio of reasoning + content (None: empty)
    prompt_script: str | None  #: dominant script of the prompt (None: too few letters)
    answer_script: str | None  #: dominant script of the content (None: too few letters)
    script_share: float | None  #: share of the content's letters in the prompt's script family
    refusal: str | None  #: the refusal phrase found
    bad_tool_calls: int  #: tool calls that do not fit the declared tools

    def columns(self) -> dict[str, Any]:
        """The row columns (names and order of :data:`COLUMNS`)."""
        return {
            "quality_flags": list(self.flags),
            "q_repeat_words": self.repeat_words,
            "q_repeat_ngram": self.repeat_ngram,
            "q_compression": self.compression,
            "q_prompt_script": self.prompt_script,
            "q_answer_script": self.answer_script,
            "q_script_share": self.script_share,
            "q_refusal": self.refusal,
            "q_bad_tool_calls": self.bad_tool_calls,
        }


#: what a row that is not checked (a native row) gets
NOT_CHECKED = Quality((), 0, 0, None, None, None, None, None, 0)


def check_turn(
    messages: Sequence[Mapping[str, Any]],
    reasoning: str | None,
    content: str,
    tool_calls: Sequence[Mapping[str, Any]] = (),
    tools: Sequence[Mapping[str, Any]] | None = None,
    finish_reason: str | None = "stop",
    *,
    think_closed: bool | None = None,
    config: QualityConfig = DEFAULT_CONFIG,
) -> Quality:
    """The checks of the module docstring on one turn. ``messages`` are the request's OpenAI
    messages, ``tool_calls`` the answer's (OpenAI shape), ``tools`` the declarations sent.
    ``think_closed``: whether the produced tokens hold ``</think>``, when the caller knows
    (server token ids); None infers it from ``finish_reason``."""
    reasoning = reasoning or ""
    truncated = finish_reason in UNFINISHED  # cut by max_tokens or by regen's loop cut
    answer = f"{reasoning}\n{content}" if reasoning and content else reasoning or content
    repeats = _repeats(answer, truncated, config)
    script = _script(messages, content, config)
    refusal = refusal_phrase(content, config.refusal_window)
    decl = declared(tools)
    bad = sum(1 for c in tool_calls if call_problem(c, decl) is not None)

    flags: set[str] = set()
    # finish_reason loop: the cut found a loop in the stream (regen.quality.loop)
    if repeats.flagged or finish_reason == LOOP:
        flags.add("repetition")
    unanswered = _unanswered(reasoning, content, tool_calls, truncated, think_closed)
    if unanswered is not None:
        flags.add(unanswered)
    if script.mismatch:
        flags.add("language_mismatch")
    if refusal is not None:
        flags.add("refusal")
    if bad:
        flags.add("bad_tool_call")
    return Quality(
        flags=tuple(f for f in FLAGS if f in flags),
        repeat_words=repeats.words,
        repeat_ngram=repeats.ngram,
        compression=None if repeats.ratio is None else round(repeats.ratio, 4),
        prompt_script=script.prompt,
        answer_script=script.answer,
        script_share=None if script.share is None else round(script.share, 4),
        refusal=refusal,
        bad_tool_calls=bad,
    )


@dataclass(slots=True, frozen=True)
class _Repeats:
    """What the ``repetition`` check measured of an answer."""

    words: int  #: words in the longest back-to-back repetition of one n-gram
    ngram: int  #: the size of that n-gram (0: none)
    ratio: float | None  #: zlib compression ratio (None: empty)
    flagged: bool  #: the repetition or the ratio makes it ``repetition``


def _repeats(answer: str, truncated: bool, config: QualityConfig) -> _Repeats:
    """The longest repetition of one n-gram and the compression ratio of ``answer``
    (reasoning and content together), against the thresholds of the module docstring."""
    run, ngram = longest_repeat(answer, config.repeat_max_ngram)
    min_words = config.repeat_min_words if truncated else config.repeat_min_words_stopped
    ratio = compression_ratio(answer) if answer else None
    raw_bytes = len(answer.encode("utf-8", "surrogatepass"))
    repeated = run >= min_words and ngram and run >= config.repeat_min_copies * ngram
    compressible = (
        ratio is not None
        and ratio < config.compression_max
        and raw_bytes >= config.compression_min_bytes
    )
    return _Repeats(run, ngram, ratio, bool(repeated or compressible))


def _unanswered(
    reasoning: str,
    content: str,
    tool_calls: Sequence[Mapping[str, Any]],
    truncated: bool,
    think_closed: bool | None,
) -> str | None:
    """``reasoning_unclosed`` or ``empty_content`` for an answer with no content and no tool
    call (see the module docstring); None for one that answered."""
    no_answer = not content.strip() and not tool_calls
    if no_answer and reasoning.strip() and (truncated or think_closed is False):
        return "reasoning_unclosed"
    if no_answer and not truncated:
        return "empty_content"
    return None


def _script(
    messages: Sequence[Mapping[str, Any]], content: str, config: QualityConfig
) -> ScriptCheck:
    """The content's script against the prompt's (the last user message's, all of theirs,
    the whole request's; regen.quality.script)."""
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    request = "\n".join(_text(m.get("content")) for m in messages if m.get("role") != "assistant")
    return script_mismatch(
        users[-1] if users else "",
        "\n".join(users),
        request,
        content,
        config.script_min_letters,
        config.script_max_share,
    )


def check_row(
    row: Mapping[str, Any],
    *,
    think_closed: bool | None = None,
    config: QualityConfig = DEFAULT_CONFIG,
) -> Quality:
    """:func:`check_turn` on a row of :mod:`regen.engine.rows` (``messages``, ``tools`` and
    ``tool_calls`` as stored JSON text); a native row (no ``finish_reason``) is not checked."""
    if row.get("finish_reason") is None:
        return NOT_CHECKED
    return check_turn(
        _json(row.get("messages"), []),
        row.get("reasoning"),
        row.get("content") or "",
        _json(row.get("tool_calls"), []),
        _json(row.get("tools"), None),
        row.get("finish_reason"),
        think_closed=think_closed,
        config=config,
    )


def __getattr__(name: str) -> Any:
    """``COLUMNS`` (a pyarrow schema) is built on first use: the manifest imports this package
    for :class:`QualityConfig` and must stay light."""
    if name == "COLUMNS":
        from regen.quality.columns import COLUMNS

        return COLUMNS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _json(value: Any, default: Any) -> Any:
    if value is None:
        return default
    return json.loads(value) if isinstance(value, str) else value


def _text(content: Any) -> str:
    """Message content as text (OpenAI content parts joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
        )
    return ""


__all__ = [
    "COLUMNS",
    "DEFAULT_CONFIG",
    "DEFAULT_DROP_FLAGS",
    "FLAGS",
    "NOT_CHECKED",
    "REFUSAL_PHRASES",
    "Quality",
    "QualityConfig",
    "check_row",
    "check_turn",
    "parse_flags",
]
