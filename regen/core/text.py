"""Words of a text, as near-duplicate detection and the quality checks count them.

NFKC-normalized, case folded; a word is a run of letters, digits or ``_``, and each CJK
character (Han, kana, Hangul) is a word of its own, since those scripts do not separate words
with spaces. Punctuation and whitespace are dropped. Owns no files.
"""

from __future__ import annotations

import re
import unicodedata

#: Han, kana and Hangul: each character is a word
CJK_RANGES = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_WORD = re.compile(rf"[{CJK_RANGES}]|[^\W{CJK_RANGES}]+")


def words(text: str) -> list[str]:
    """The normalized words of ``text`` (module docstring)."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())
