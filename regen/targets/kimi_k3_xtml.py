"""Kimi K3's XTML markup: its four special tokens, its tags, and the segments a prompt is
written in (the format, and where each fact was read: :mod:`regen.targets.kimi_k3`).

Owns no files. A tag is ``<|open|>{name}{ k="v"}*<|sep|>`` … ``<|close|>{name}<|sep|>``
(attribute values escape ``&`` then ``"``); :class:`Segments` writes one piece by piece, each
piece marked as K3's tokenizer encodes it (a control piece with special tokens recognised, any
other as plain text). The channel markers are what the family assembles answers from and splits
them at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

OPEN, CLOSE, SEP, END_OF_MSG = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of a K3 prompt and how K3's tokenizer encodes it: a ``control`` piece with
    special tokens recognised, any other as plain text (:mod:`regen.targets.kimi_k3`)."""

    text: str
    control: bool = False


class Segments(list[Segment]):
    """A prompt being written, piece by piece (empty pieces are left out, as the encoder's)."""

    def control(self, text: str) -> None:
        if text:
            self.append(Segment(text, True))

    def text(self, text: object) -> None:
        text = str(text)
        if text:
            self.append(Segment(text))

    def open(self, tag: str, attrs: Sequence[tuple[str, object]] = ()) -> None:
        """``<|open|>{tag}{ key="value"}*<|sep|>``."""
        self.control(OPEN)
        self.text(tag)
        for key, value in attrs:
            self.text(f" {key}")
            self.text('="')
            self.text(escape(value))
            self.text('"')
        self.control(SEP)

    def close(self, tag: str) -> None:
        """``<|close|>{tag}<|sep|>``."""
        self.control(CLOSE)
        self.text(tag)
        self.control(SEP)

    def joined(self) -> str:
        return "".join(s.text for s in self)


def escape(value: object) -> str:
    """An attribute value: ``&`` then ``"`` escaped."""
    return str(value).replace("&", "&amp;").replace('"', "&quot;")


def open_tag(tag: str, attrs: Sequence[tuple[str, object]] = ()) -> str:
    out = Segments()
    out.open(tag, attrs)
    return out.joined()


def close_tag(tag: str) -> str:
    return f"{CLOSE}{tag}{SEP}"


THINK_OPEN, THINK_CLOSE = open_tag("think"), close_tag("think")
RESPONSE_OPEN, RESPONSE_CLOSE = open_tag("response"), close_tag("response")
TOOLS_OPEN, TOOLS_CLOSE = open_tag("tools"), close_tag("tools")
MESSAGE_CLOSE = close_tag("message")
CALL_OPEN = f"{OPEN}call"
ASSISTANT_OPEN = open_tag("message", [("role", "assistant")])
#: what ends every message, and so every answer
MESSAGE_END = f"{MESSAGE_CLOSE}{END_OF_MSG}"
