"""A family the checkpoint describes itself: its tokenizer's ``response_template``.

Owns no files. A tokenizer folder may ship, in ``tokenizer_config.json``, a ``response_template``:
how the model's answer is written, as delimiters (literal texts or regexes) around its fields.
transformers parses answers with it (``tokenizer.parse_response``, ``utils/chat_parsing/``),
vLLM 0.32 serves with it (``--tool-call-parser hf --reasoning-parser hf``,
``parser/response_template.py``), and so does SGLang 0.5.23 (``--tool-call-parser
response_template --reasoning-parser response_template``). Both engines accept only the fields
``thinking``, ``content`` and ``tool_calls`` and return each field's text raw (nothing
stripped), arguments as text (an argument body parsed as JSON comes back ``json.dumps``-ed).

For a target of no family module whose folder ships one, regen reads from it
(:func:`delimiters`) what a family decides: the reasoning markers (``thinking``'s open and close),
the end token(s) (``content``'s close: every alternative of it ends an answer), the call framing
(``tool_calls``: a section opener, each call's opener around its name, its closer, a section
closer), and from the chat template the thinking switch (``enable_thinking`` or ``thinking``,
as SGLang's ``parser/template_detection.py`` finds it). That gives the local cross-check, the
quality checks' markers and ``regen serve-command``'s parser flags. A family module, where one
exists, takes precedence (its assembly writes the model's exact whitespace; regen.targets).

A delimiter given as a regex is read back as the text the model writes, by these rules (the
inverse of the parse): literal characters and escapes as they are; of alternatives the first
(every alternative of the end counts as an end token); the named group ``name`` is the call's
name; ``\\d+`` outside it the call's index (0, 1, ...); a leading optional group of a call's
opener is the section opener, written once before the first call, and a trailing optional group
of its closer the section closer, written once after the last; whitespace that a ``\\s*``
swallowed is not returned by any parser, so it is written as nothing (``\\s+`` as one space).
Anything else (another character class, an optional group inside) cannot be read back: such a
template still serves and trains on the server's ids, but its answers with calls are not
assembled here (:class:`NotInvertible`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from regen.core import jsontext
from regen.core.errors import TemplateError
from regen.core.sample import ToolCall
from regen.targets.family import Family, Parsers, TokenizerFacts

log = logging.getLogger(__name__)

#: the ``target.family`` of a target described by its own response_template
NAME = "response_template"
#: the fields the engines serve (vLLM's and SGLang's ``_check_serving_fields``)
SERVED_FIELDS = ("thinking", "content", "tool_calls")
#: placeholders of a call opener's name and index
NAME_MARK, INDEX_MARK = "\0name\0", "\0index\0"


class NotInvertible(ValueError):
    """A delimiter whose text cannot be read back from the template (module docstring)."""


@dataclass(frozen=True, slots=True)
class CallFraming:
    """How the model writes its calls: ``section_open``, then per call ``open`` (holding the
    name and index marks), the arguments, ``close``; then ``section_close``."""

    open: str
    close: str
    section_open: str = ""
    section_close: str = ""
    #: the arguments come back as written (``content: text``); False: re-serialized JSON
    verbatim: bool = True


@dataclass(frozen=True, slots=True)
class Delimiters:
    """What a response_template says about the answer (module docstring)."""

    think: tuple[str, str] | None
    ends: tuple[str, ...]
    calls: CallFraming | None
    #: why the calls cannot be assembled here ('' when they can, or there are none)
    calls_unreadable: str = ""
    #: the assistant turn's start anchors (literal ones)
    anchors: tuple[str, ...] = ()


def delimiters(template: Mapping[str, object]) -> Delimiters:
    """Read a response_template's delimiters (ValueError: not a template the engines serve)."""
    fields = template.get("fields")
    if not isinstance(fields, Mapping) or not fields:
        raise ValueError("response_template has no fields")
    unknown = sorted(set(fields) - set(SERVED_FIELDS))
    if unknown:
        raise ValueError(f"response_template fields {unknown}: vLLM and SGLang serve only "
                         f"{', '.join(SERVED_FIELDS)}")  # fmt: skip
    think = _think(fields.get("thinking"))
    content = fields.get("content") or {}
    ends = tuple(_all_texts(content, "close"))
    calls, why = None, ""
    if "tool_calls" in fields:
        try:
            calls = _calls(fields["tool_calls"])
        except NotInvertible as e:
            why = str(e)
    anchors = tuple(_literals(template.get("start_anchor")))
    return Delimiters(think, ends, calls, why, anchors)


def _think(spec: object) -> tuple[str, str] | None:
    if not isinstance(spec, Mapping):
        return None
    return _one_text(spec, "open"), _one_text(spec, "close")


def _calls(spec: object) -> CallFraming:
    if not isinstance(spec, Mapping):
        raise NotInvertible("tool_calls is not a field spec")
    transform = spec.get("transform") or {}
    fn = transform.get("function") if isinstance(transform, Mapping) else None
    if not (isinstance(fn, Mapping) and fn.get("name") == "{name}"
            and fn.get("arguments") == "{content}"):  # fmt: skip
        raise NotInvertible("tool_calls' transform is not {name} + {content} arguments")
    if spec.get("transform_each"):
        raise NotInvertible("tool_calls' transform_each")
    kind = spec.get("content", "text")
    if kind not in ("text", "json"):
        raise NotInvertible(f"tool_calls' content parser {kind!r}")
    section_open, call_open = _split_leading(_pattern(spec, "open"))
    call_close, section_close = _split_trailing(_pattern(spec, "close"))
    opener = _text(call_open)
    if NAME_MARK not in opener:
        raise NotInvertible("the call's opener does not capture its name")
    return CallFraming(opener, _text(call_close), _text(section_open), _text(section_close),
                       verbatim=kind == "text")  # fmt: skip


def _literals(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def _pattern(spec: Mapping[str, object], side: str) -> list[Node]:
    """The parsed delimiter ``side`` (``open``/``close``) of a field: a literal (its first
    form) as one text node, a regex parsed."""
    lits = _literals(spec.get(side))
    if lits:
        return [Text(lits[0])]
    pattern = spec.get(f"{side}_pattern")
    if not isinstance(pattern, str):
        return []
    return _parse(pattern)


def _one_text(spec: Mapping[str, object], side: str) -> str:
    return _text(_pattern(spec, side))


def _all_texts(spec: Mapping[str, object], side: str) -> list[str]:
    """Every text the delimiter ``side`` matches (literal forms, or each alternative of a
    regex), in the template's order."""
    lits = _literals(spec.get(side))
    if lits:
        return lits
    pattern = spec.get(f"{side}_pattern")
    return _expand(_parse(pattern)) if isinstance(pattern, str) else []


# -- a small regex reader: the subset response templates use ------------------------------------
@dataclass(frozen=True, slots=True)
class Text:
    """Literal text."""

    text: str


@dataclass(frozen=True, slots=True)
class CharClass:
    """A character class (``[^"]``, ``\\s``, ``.``): its spec as the pattern writes it."""

    spec: str


@dataclass(frozen=True, slots=True)
class Group:
    """A group: its name (None: unnamed) and its alternatives."""

    name: str | None
    alternatives: list[list[Node]]


@dataclass(frozen=True, slots=True)
class Repeat:
    """A quantified node: ``lo`` to ``hi`` times (None: no bound)."""

    node: Node
    lo: int
    hi: int | None


#: a parsed node
Node = Text | CharClass | Group | Repeat
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t"}
_CLASSES = frozenset("sdwSDW")


def _parse(pattern: str) -> list[Node]:
    nodes, end = _parse_alternatives(pattern, 0)
    if end != len(pattern):
        raise NotInvertible(f"unbalanced regex {pattern!r}")
    if len(nodes) != 1:
        return [Group(None, nodes)]
    return nodes[0]


def _parse_alternatives(p: str, i: int) -> tuple[list[list[Node]], int]:
    alternatives: list[list[Node]] = [[]]
    while i < len(p) and p[i] != ")":
        if p[i] == "|":
            alternatives.append([])
            i += 1
            continue
        node, i = _parse_atom(p, i)
        node, i = _quantified(p, i, node)
        alternatives[-1].append(node)
    return alternatives, i


def _parse_atom(p: str, i: int) -> tuple[Node, int]:
    ch = p[i]
    if ch == "\\":
        nxt = p[i + 1]
        if nxt in _CLASSES:
            return CharClass("\\" + nxt), i + 2
        return Text(_ESCAPES.get(nxt, nxt)), i + 2
    if ch == "[":
        start = i + 2 if p.startswith("[^", i) else i + 1
        end = p.index("]", start + 1)  # a ']' first in the class is a character of it
        return CharClass(p[i : end + 1]), end + 1
    if ch == "(":
        return _parse_group(p, i)
    if ch in "^$":
        return Text(""), i + 1
    if ch == ".":
        return CharClass("."), i + 1
    return Text(ch), i + 1


def _parse_group(p: str, i: int) -> tuple[Node, int]:
    """A group at ``p[i] == '('``: named, non-capturing, capturing, or a lookaround (which
    matches no text)."""
    name: str | None = None
    j = i + 1
    look = next((x for x in ("?<=", "?<!", "?=", "?!") if p.startswith(x, j)), None)
    if look is not None:
        _, j = _parse_alternatives(p, j + len(look))
        return Text(""), j + 1
    if p.startswith("?P<", j):
        k = p.index(">", j)
        name, j = p[j + 3 : k], k + 1
    elif p.startswith("?:", j):
        j += 2
    alternatives, j = _parse_alternatives(p, j)
    return Group(name, alternatives), j + 1


def _quantified(p: str, i: int, node: Node) -> tuple[Node, int]:
    if i >= len(p) or p[i] not in "?*+{":
        return node, i
    bounds: tuple[int, int | None]
    if p[i] == "{":
        end = p.index("}", i)
        lo, _, hi = p[i + 1 : end].partition(",")
        bounds = (int(lo or 0), int(hi) if hi else (None if "," in p[i:end] else int(lo or 0)))
        i = end + 1
    else:
        bounds = {"?": (0, 1), "*": (0, None), "+": (1, None)}[p[i]]
        i += 1
    if i < len(p) and p[i] in "?+":  # lazy or possessive: the same texts
        i += 1
    return Repeat(node, *bounds), i


def _split_leading(nodes: list[Node]) -> tuple[list[Node], list[Node]]:
    """A leading optional group (the section opener) and the rest."""
    if nodes and (inner := _optional_group(nodes[0])) is not None:
        return [inner], nodes[1:]
    return [], nodes


def _split_trailing(nodes: list[Node]) -> tuple[list[Node], list[Node]]:
    """The rest and a trailing optional group (the section closer)."""
    if nodes and (inner := _optional_group(nodes[-1])) is not None:
        return nodes[:-1], [inner]
    return nodes, []


def _optional_group(node: Node) -> Group | None:
    """The group of an optional group (``(...)?``), else None."""
    if isinstance(node, Repeat) and node.lo == 0 and isinstance(node.node, Group):
        return node.node
    return None


def _text(nodes: Sequence[Node]) -> str:
    """The text the model writes for ``nodes`` (module docstring's rules)."""
    return "".join(_node_text(n) for n in nodes)


def _node_text(node: Node) -> str:
    if isinstance(node, Text):
        return node.text
    if isinstance(node, Group):
        if node.name == "name":
            return NAME_MARK
        if node.name is not None:
            raise NotInvertible(f"a named group {node.name!r} other than the call's name")
        return _text(node.alternatives[0])
    if isinstance(node, Repeat):
        inner, lo = node.node, node.lo
        if inner == CharClass("\\s"):
            return "" if lo == 0 else " "
        if inner == CharClass("\\d") and lo >= 1:
            return INDEX_MARK
        if lo == 0:
            raise NotInvertible("an optional part of a delimiter")
        return _node_text(inner) * lo
    raise NotInvertible(f"a character class {node.spec!r} outside the call's name")


def _expand(nodes: Sequence[Node], limit: int = 16) -> list[str]:
    """Every text of ``nodes`` through their alternatives (optional parts absent)."""
    texts = [""]
    for node in nodes:
        if isinstance(node, Group) and node.name is None:
            options = [t for alt in node.alternatives for t in _expand(alt, limit)]
        else:
            options = [_node_text(node)]
        texts = [a + b for a in texts for b in options][:limit]
    return texts


# -- the family ------------------------------------------------------------------------------------
@dataclass(frozen=True, repr=False)
class ResponseTemplateFamily(Family):
    """The family a folder's response_template describes (module docstring)."""

    #: what the template says (None only for a family built without one)
    delims: Delimiters | None = None

    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        if not calls:
            return ""
        framing = self.delims.calls if self.delims is not None else None
        if framing is None:
            why = self.delims.calls_unreadable if self.delims is not None else ""
            raise TemplateError("the response_template's calls cannot be written back here: "
                                f"{why or 'it has no tool_calls'}")  # fmt: skip
        out = [framing.section_open]
        for i, c in enumerate(calls):
            head = framing.open.replace(NAME_MARK, c.name).replace(INDEX_MARK, str(i))
            args = c.arguments if framing.verbatim else _dumped(c.arguments)
            out.append(f"{head}{args}{framing.close}")
        out.append(framing.section_close)
        return "".join(out)


def _dumped(arguments: str) -> str:
    """Arguments as the engines return a JSON body: ``json.dumps`` of the parsed value."""
    try:
        return json.dumps(jsontext.loads(arguments), ensure_ascii=False)
    except ValueError:
        return arguments


#: the chat-template keyword that switches thinking, as SGLang's template detection reads it
_SWITCHES = ("enable_thinking", "thinking")


def from_facts(facts: TokenizerFacts) -> ResponseTemplateFamily | None:
    """The family a tokenizer folder's response_template describes (None: it ships none, or one
    the engines cannot serve: said in one line)."""
    template = facts.response_template
    if template is None:
        return None
    try:
        delims = delimiters(template)
    except (ValueError, NotInvertible) as e:
        log.warning("the tokenizer's response_template is not one the engines serve: %s", e)
        return None
    if delims.calls_unreadable:
        log.warning("the response_template's tool calls cannot be written back here (%s): rows "
                    "with calls rest on the server's ids", delims.calls_unreadable)  # fmt: skip
    switch = next((s for s in _SWITCHES if re.search(rf"\b{s}\b", facts.chat_template)), None)
    reasoning = "response_template" if delims.think is not None else None
    calls = delims.calls is not None or bool(delims.calls_unreadable)
    return ResponseTemplateFamily(
        name=NAME,
        title="a checkpoint's own response_template",
        end_of_turn=delims.ends[0] if delims.ends else "",
        special_tokens=tuple(t for t in _delimiter_texts(delims) if t in facts.tokens),
        turn_open_tokens=tuple(a for a in delims.anchors if a in facts.tokens),
        call_markers=_call_markers(delims),
        sglang=Parsers(tool="response_template" if calls else None, reasoning=reasoning),
        vllm=Parsers(tool="hf" if calls else None, reasoning="hf" if reasoning else None),
        aux_shift="first_is_one",  # the loader is not known: the safe side
        think=delims.think,
        thinking_kwarg=switch,
        other_ends=delims.ends[1:],
        delims=delims,
    )


def _delimiter_texts(d: Delimiters) -> list[str]:
    texts = [*(d.think or ()), *d.ends, *d.anchors]
    if d.calls is not None:
        texts += [d.calls.section_open, d.calls.close, d.calls.section_close]
        texts += [p for p in re.split(f"{NAME_MARK}|{INDEX_MARK}", d.calls.open) if p]
    return [t for t in dict.fromkeys(texts) if t]


def _call_markers(d: Delimiters) -> tuple[str, ...]:
    if d.calls is None:
        return ()
    head = d.calls.open.split(NAME_MARK, 1)[0].split(INDEX_MARK, 1)[0]
    return tuple(t for t in (d.calls.section_open, head) if t)
