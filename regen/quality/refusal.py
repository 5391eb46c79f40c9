"""Refusals: an answer whose content opens with one of :data:`REFUSAL_PHRASES`.

Only the opening of the content is searched (``window`` characters, case folded, typographic
apostrophes made straight, NFKC, whitespace collapsed): an answer that helps and later says "I can't
stress this enough" is not a refusal; one that declines and then suggests alternatives is.
The phrases are first-person declines in English and Chinese, the languages the target answers
most; docs/quality.md lists them.
"""

from __future__ import annotations

import unicodedata

#: first-person declines (lower case, straight apostrophes, ASCII commas)
REFUSAL_PHRASES: tuple[str, ...] = (
    "i'm sorry, but i can't",
    "i'm sorry, but i cannot",
    "i am sorry, but i cannot",
    "i am sorry, but i can't",
    "sorry, but i can't help",
    "sorry, i can't help",
    "sorry, i can't assist",
    "i can't help with that",
    "i cannot help with that",
    "i can't help with this",
    "i cannot help with this",
    "i can't assist with",
    "i cannot assist with",
    "i can't comply",
    "i cannot comply",
    "i can't fulfill",
    "i cannot fulfill",
    "i can't provide that",
    "i cannot provide that",
    "i'm unable to help",
    "i am unable to help",
    "i'm unable to assist",
    "i am unable to assist",
    "i'm not able to help with",
    "i am not able to help with",
    "i won't be able to help",
    "i must decline",
    "i have to decline",
    "as an ai language model, i cannot",
    "as an ai, i cannot",
    "i'm not comfortable",
    "抱歉,我无法",
    "抱歉,我不能",
    "对不起,我无法",
    "对不起,我不能",
    "我无法提供",
    "我不能提供",
    "我无法协助",
    "我无法帮助",
)


def _normalize(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()  # NFKC: "," becomes ","
    return " ".join(text.replace("\u2019", "'").replace("\u2018", "'").split())


def refusal_phrase(content: str, window: int) -> str | None:
    """The first phrase of :data:`REFUSAL_PHRASES` in the opening ``window`` characters."""
    head = _normalize(content[: window * 2])[:window]
    for phrase in REFUSAL_PHRASES:
        if phrase in head:
            return phrase
    return None
