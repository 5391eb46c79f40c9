"""Which writing system a text is in: letters counted per script by Unicode block, no model.

Counted scripts: latin, greek, cyrillic, armenian, hebrew, arabic, devanagari, bengali, tamil,
thai, georgian, hangul, kana and han. A Han, kana or Hangul character counts
:data:`CJK_WEIGHT` letters (one such character carries about as much as a short word of an
alphabet). Code is not language: fenced blocks, inline code and URLs are removed before
counting. Han and kana are one family (Japanese writes both); Hangul texts may quote Han.

A mismatch (:func:`script_mismatch`): the prompt's last user message (all user messages when it
has fewer than ``min_letters``) is mostly in one script, the answer's content mostly in scripts
outside that script's family (less than ``max_share`` of its letters inside), the user messages
do not write the answer's script too (at least ``min_letters`` letters and ``max_share`` of
theirs), and no request text (system, user or tool) names the answer's language or a
translation (:data:`LANGUAGE_NAMES`, :data:`TRANSLATE_WORDS`). Two languages of one script
(English and French) are not told apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: letters one Han, kana or Hangul character counts for
CJK_WEIGHT = 3.0

_RANGES: dict[str, str] = {
    "latin": "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff",
    "greek": "\u0370-\u03ff\u1f00-\u1fff",
    "cyrillic": "\u0400-\u04ff\u0500-\u052f",
    "armenian": "\u0530-\u058f",
    "hebrew": "\u0590-\u05ff",
    "arabic": "\u0600-\u06ff\u0750-\u077f\ufb50-\ufdff\ufe70-\ufeff",
    "devanagari": "\u0900-\u097f",
    "bengali": "\u0980-\u09ff",
    "tamil": "\u0b80-\u0bff",
    "thai": "\u0e00-\u0e7f",
    "georgian": "\u10a0-\u10ff",
    "hangul": "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af",
    "kana": "\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f",
    "han": "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff",
}
_PATTERNS = {name: re.compile(f"[{chars}]") for name, chars in _RANGES.items()}
_CJK = frozenset({"hangul", "kana", "han"})
#: scripts an answer may use for a prompt in the key's script
FAMILY: dict[str, frozenset[str]] = {
    "han": frozenset({"han", "kana"}),
    "kana": frozenset({"kana", "han"}),
    "hangul": frozenset({"hangul", "han"}),
}
#: words in a request that make an answer in that script expected (case folded, substrings)
LANGUAGE_NAMES: dict[str, tuple[str, ...]] = {
    "latin": ("english", "英语", "英文", "英語", "영어", "англ", "pinyin", "romaji", "romaniz",
              "romanis", "translitera", "latin"),
    "greek": ("greek", "ελληνικ", "греч"),
    "cyrillic": ("russian", "ukrainian", "bulgarian", "serbian", "kazakh", "belarus", "macedonian",
                 "mongolian", "cyrillic", "俄语", "俄文", "ロシア語", "러시아어"),
    "armenian": ("armenian",),
    "hebrew": ("hebrew", "yiddish", "עברית"),
    "arabic": ("arabic", "persian", "farsi", "urdu", "pashto", "عرب", "فارسی", "阿拉伯"),
    "devanagari": ("hindi", "marathi", "nepali", "sanskrit", "devanagari", "हिन्दी", "हिंदी"),
    "bengali": ("bengali", "bangla", "বাংলা"),
    "tamil": ("tamil", "தமிழ்"),
    "thai": ("thai", "ไทย", "泰语"),
    "georgian": ("georgian",),
    "hangul": ("korean", "hangul", "한국어", "韩语", "韓国語", "корей"),
    "kana": ("japanese", "hiragana", "katakana", "日本語", "日语", "日文", "일본어", "япон"),
    "han": ("chinese", "mandarin", "cantonese", "kanji", "hanzi", "中文", "汉语", "漢語", "普通话",
            "简体", "繁體", "繁体", "日本語", "日语", "中国語", "중국어", "китай", "japanese"),
}  # fmt: skip
#: words that make an answer in any script expected (case folded, substrings)
TRANSLATE_WORDS = (
    "translat",
    "翻译",
    "翻譯",
    "翻訳",
    "번역",
    "перев",
    "traduc",
    "übersetz",
    "tradu",
)

_CODE = re.compile(r"```.*?(?:```|\Z)|`[^`\n]*`|https?://\S+", re.DOTALL)


@dataclass(slots=True, frozen=True)
class ScriptCheck:
    """The scripts of a prompt and an answer, and whether they mismatch."""

    prompt: str | None  #: dominant script of the prompt (None: too few letters)
    answer: str | None  #: dominant script of the answer's content (None: too few letters)
    share: float | None  #: share of the answer's letters in the prompt script's family
    mismatch: bool


def letters(text: str) -> dict[str, float]:
    """Weighted letters per script of ``text`` without its code (module docstring)."""
    text = _CODE.sub(" ", text)
    out: dict[str, float] = {}
    for name, pattern in _PATTERNS.items():
        n = len(pattern.findall(text))
        if n:
            out[name] = n * (CJK_WEIGHT if name in _CJK else 1.0)
    return out


def dominant(counts: dict[str, float], min_letters: float) -> str | None:
    """The script with most letters, None when all scripts together have fewer than
    ``min_letters`` (ties: the first in :data:`_RANGES` order)."""
    if sum(counts.values()) < min_letters:
        return None
    return max(counts, key=counts.__getitem__)


def script_mismatch(
    last_user: str, users: str, request: str, answer: str, min_letters: float, max_share: float
) -> ScriptCheck:
    """The check of the module docstring. ``last_user``: the last user message; ``users``: all
    user messages; ``request``: all non-assistant text (system, user, tool), searched for
    language names; ``answer``: the answer's content."""
    counts = letters(last_user)
    if sum(counts.values()) < min_letters:
        counts = letters(users)
    p = dominant(counts, min_letters)
    a_counts = letters(answer)
    a = dominant(a_counts, min_letters)
    if p is None or a is None:
        return ScriptCheck(p, a, None, False)
    family = FAMILY.get(p, frozenset({p}))
    share = sum(v for k, v in a_counts.items() if k in family) / sum(a_counts.values())
    if share >= max_share:
        return ScriptCheck(p, a, share, False)
    answer_family = FAMILY.get(a, frozenset({a}))
    user_counts = letters(users)
    in_answer_script = sum(v for k, v in user_counts.items() if k in answer_family)
    if in_answer_script >= max(min_letters, max_share * sum(user_counts.values())):
        return ScriptCheck(p, a, share, False)  # the user writes the answer's script too
    folded = request.casefold()
    if any(w in folded for w in TRANSLATE_WORDS) or any(
        w in folded for w in LANGUAGE_NAMES.get(a, ())
    ):
        return ScriptCheck(p, a, share, False)  # asked for: a translation or that language
    return ScriptCheck(p, a, share, True)
