"""The simulator's deterministic answer: a pure function of the request.

``answer(request)`` depends only on the request's ``messages``, ``tools``, ``seed`` and the
``thinking`` switch in ``chat_template_kwargs`` (plus ``max_tokens``, which only cuts). The same
request always gets byte-identical reasoning, content and tool calls, whatever faults, timing or
server process served it, so a test can compare stored content with ``answer(request)``.

Lengths are long-tailed: the total is lognormal around :attr:`AnswerConfig.mean_tokens`; with
thinking on, a share of 30-80% goes to reasoning. The normal draw behind the length mixes a part
fixed by the prompt (:func:`prompt_z`: the seed and the last user message) with a part drawn
from the whole request; :attr:`AnswerConfig.prompt_share` is the prompt's share of its variance
(0, the default, keeps every answer as it was before the knob existed). A ``max_tokens`` cap
keeps the first tokens (reasoning, then content, then whole tool calls) and sets
``finish_reason`` to ``"length"``. Tokens are the word pieces of
:mod:`regen.devkit.simulate.tokens`.

Degenerate answers (:attr:`AnswerConfig.degenerate_rate`, 0 by default): a share of requests,
drawn from the request's own digest apart from everything else (:func:`degenerate_kind`), gets
one of the answers a thinking model at temperature 1.0 sometimes gives instead
(:data:`DEGENERATE_KINDS`): ``loop`` (a few words of normal text, then one sentence repeated
until ``max_tokens``: in the reasoning when thinking, else in the content; ``finish_reason``
``"length"``), ``empty`` (normal reasoning, then nothing: empty content, no tool call,
``"stop"``) or ``language`` (normal reasoning, content of at least :data:`LANGUAGE_MIN_TOKENS`
in another script than the prompt's: Cyrillic, or Han when the prompt writes Cyrillic). The draw
depends on the seed too, so a request sent again with another seed may come back clean. Answers
not drawn are exactly the answers of rate 0, and rate 0 leaves every answer as it was before the
knob existed.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from regen.devkit.simulate.tokens import _content_text, count_tokens, split_pieces
from regen.devkit.simulate.tokens import prompt_tokens as count_prompt_tokens

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "it",
    "for",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "from",
    "at",
    "or",
    "an",
    "have",
    "not",
    "which",
    "but",
    "all",
    "can",
    "one",
    "has",
    "more",
    "when",
    "there",
    "will",
    "were",
    "some",
    "their",
    "what",
    "out",
    "would",
    "about",
    "into",
    "than",
    "only",
    "other",
    "time",
    "new",
    "these",
    "two",
    "may",
    "first",
    "then",
    "any",
    "like",
    "over",
    "such",
    "our",
    "also",
    "most",
    "where",
    "after",
    "through",
    "well",
    "because",
    "each",
    "between",
    "both",
    "under",
    "never",
    "same",
    "another",
    "while",
    "model",
    "draft",
    "token",
    "answer",
    "batch",
    "server",
    "request",
    "value",
    "result",
    "reason",
    "step",
    "check",
    "simple",
    "number",
    "state",
    "order",
    "write",
    "read",
    "layer",
    "hidden",
    "weight",
    "cache",
    "queue",
    "slot",
    "speculative",
    "decode",
    "prefix",
    "sample",
    "turn",
    "stream",
    "parse",
    "verify",
    "measure",
    "compute",
    "function",
    "argument",
    "return",
    "error",
    "retry",
    "backoff",
    "length",
    "context",
    "prompt",
    "output",
    "input",
    "format",
    "schema",
    "record",
    "shard",
    "endpoint",
    "accept",
    "reject",
    "greedy",
    "sampling",
    "tensor",
    "vector",
    "matrix",
    "gradient",
    "training",
    "inference",
    "latency",
    "throughput",
    "capacity",
    "utilization",
    "deterministic",
    "consistent",
    "careful",
    "therefore",
    "however",
    "first",
    "second",
    "finally",
    "example",
    "consider",
    "suppose",
    "notice",
    "indeed",
    "thus",
    "hence",
]

#: the tokens a tool-call section costs besides its ids and arguments (section + call markers)
SECTION_TOKENS = 2
CALL_TOKENS = 3


class AnswerConfig(BaseModel):
    """Knobs of the answer function (``regen simulate``'s "answers" flags; each field's
    description is its help text)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mean_tokens: float = Field(
        default=256.0, gt=0, description="mean answer length in simulated tokens (lognormal)"
    )
    length_scale: float = Field(default=1.0, gt=0, description="multiplies --mean-tokens")
    length_sigma: float = Field(
        default=1.0, ge=0, description="lognormal sigma; 0 gives every answer the mean length"
    )
    tool_call_rate: float = Field(
        default=0.5, ge=0, le=1, description="share of requests with tools that call one"
    )
    prompt_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="share of the variance of log answer length fixed by the prompt (seed + "
        "last user message), 0-1; 0 keeps every answer as before the knob existed",
    )

    degenerate_rate: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="share of answers that are degenerate (a loop until max_tokens, empty "
        "content after reasoning, or another script than the prompt's), 0-1; drawn from the "
        "request, seed included, so a new seed draws again; 0 keeps every answer as before",
    )

    @property
    def mean(self) -> float:
        """The mean answer length the draws use (``mean_tokens × length_scale``)."""
        return self.mean_tokens * self.length_scale


@dataclass(slots=True, frozen=True)
class SimToolCall:
    """One tool call of a simulated answer (OpenAI shape: id, function name, JSON arguments)."""

    id: str
    name: str
    arguments: str
    tokens: int  #: simulated tokens this call costs

    def as_openai(self, index: int) -> dict[str, Any]:
        return {
            "index": index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(slots=True, frozen=True)
class SimAnswer:
    """What the simulated model produces for one request."""

    reasoning: str  #: "" when thinking is off
    content: str
    tool_calls: tuple[SimToolCall, ...]
    finish_reason: str  #: "stop", "tool_calls" or "length"
    reasoning_pieces: tuple[str, ...]  #: the tokens of ``reasoning``
    content_pieces: tuple[str, ...]  #: the tokens of ``content``
    tool_tokens: int  #: tokens of the tool-call section (0 without calls)
    prompt_tokens: int  #: simulated prompt length (see tokens.prompt_tokens)
    degenerate: str | None = None  #: the kind of DEGENERATE_KINDS, None for a normal answer

    @property
    def reasoning_tokens(self) -> int:
        return len(self.reasoning_pieces)

    @property
    def completion_tokens(self) -> int:
        return len(self.reasoning_pieces) + len(self.content_pieces) + self.tool_tokens


DEFAULT_CONFIG = AnswerConfig()


def thinking_enabled(request: Mapping[str, Any]) -> bool:
    """The request's thinking switch (``chat_template_kwargs.thinking``; default on, as K2.5)."""
    kwargs = request.get("chat_template_kwargs") or {}
    for key in ("thinking", "enable_thinking"):
        if key in kwargs:
            return bool(kwargs[key])
    return True


def requested_max_tokens(request: Mapping[str, Any]) -> int | None:
    """``max_completion_tokens`` or ``max_tokens``, whichever the request sets."""
    value = request.get("max_completion_tokens")
    if value is None:
        value = request.get("max_tokens")
    return None if value is None else int(value)


def answer_seed(request: Mapping[str, Any]) -> bytes:
    """The digest the answer is drawn from (independent of max_tokens)."""
    material = {
        "messages": request.get("messages"),
        "tools": request.get("tools") or None,
        "seed": request.get("seed"),
        "thinking": thinking_enabled(request),
    }
    blob = json.dumps(material, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).digest()


def prompt_z(seed: int | None, user_text: str) -> float:
    """The prompt's standard-normal length draw: a pure function of ``seed`` and the text of
    the last user message (what the prompt decides of an answer's length)."""
    blob = json.dumps(
        {"seed": seed, "user": user_text}, sort_keys=True, ensure_ascii=False, separators=(",", ":")
    )
    digest = hashlib.sha256(blob.encode("utf-8", "surrogatepass")).digest()
    return random.Random(int.from_bytes(digest[:16], "big")).gauss(0.0, 1.0)


def last_user_text(messages: Iterable[Any]) -> str | None:
    """Text of the last ``user`` message (content parts joined), None without one."""
    text = None
    for m in messages:
        if isinstance(m, Mapping) and m.get("role") == "user":
            text = _content_text(m.get("content"))
    return text


def request_prompt_z(request: Mapping[str, Any]) -> float | None:
    """:func:`prompt_z` of a request body; None when it has no user message."""
    text = last_user_text(request.get("messages") or ())
    return None if text is None else prompt_z(request.get("seed"), text)


def _word_pieces(prefix: str, capital: bool) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(split_pieces(prefix + (w.capitalize() if capital else w))) for w in _WORDS)


#: the pieces of every vocabulary word: mid-sentence, opening the text, opening a sentence,
#: opening a paragraph (precomputed: answers are drawn word by word)
_MID = _word_pieces(" ", False)
_FIRST = _word_pieces("", True)
_OPEN = _word_pieces(" ", True)
_PARAGRAPH = _word_pieces("\n\n", True)


def _sentence_pieces(rng: random.Random, n: int) -> list[str]:
    """Exactly ``n`` simulated tokens of English-looking text."""
    pieces: list[str] = []
    extend, append, rand = pieces.extend, pieces.append, rng.random
    n_words = len(_WORDS)
    table = _FIRST
    left_in_sentence = 5 + int(rand() * 12)
    while len(pieces) < n:
        extend(table[int(rand() * n_words)])
        left_in_sentence -= 1
        if left_in_sentence <= 0:
            append(".")
            table = _PARAGRAPH if rand() < 0.15 else _OPEN
            left_in_sentence = 5 + int(rand() * 12)
        else:
            table = _MID
            if rand() < 0.06:
                append(",")
    return pieces[:n]


def _argument_value(rng: random.Random, schema: Any) -> Any:
    if not isinstance(schema, Mapping):
        return rng.choice(_WORDS)
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind in ("integer", "int"):
        return rng.randint(0, 100)
    if kind in ("number", "float"):
        return round(rng.uniform(0, 100), 2)
    if kind in ("boolean", "bool"):
        return rng.random() < 0.5
    if kind == "array":
        return [_argument_value(rng, schema.get("items")) for _ in range(rng.randint(1, 2))]
    if kind in ("object", "dict"):
        return {}
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))


def _tool_calls(
    rng: random.Random, tools: list[Any], messages: list[Any]
) -> tuple[SimToolCall, ...]:
    usable: list[Mapping[str, Any]] = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str) and fn["name"]:
            usable.append(fn)
    if not usable:
        return ()
    counter = sum(
        len(m.get("tool_calls") or ())
        for m in messages
        if isinstance(m, Mapping) and m.get("role") == "assistant"
    )
    n_calls = 2 if len(usable) > 1 and rng.random() < 0.2 else 1
    calls = []
    for i in range(n_calls):
        fn = rng.choice(usable)
        raw_params = fn.get("parameters")
        params = raw_params if isinstance(raw_params, Mapping) else {}
        raw_props = params.get("properties")
        props = raw_props if isinstance(raw_props, Mapping) else {}
        required = [k for k in params.get("required") or () if k in props] or list(props)[:3]
        args = {k: _argument_value(rng, props[k]) for k in required}
        arguments = json.dumps(args, ensure_ascii=False)
        call_id = f"functions.{fn['name']}:{counter + i}"
        tokens = CALL_TOKENS + count_tokens(call_id) + count_tokens(arguments)
        calls.append(SimToolCall(call_id, fn["name"], arguments, tokens))
    return tuple(calls)


def answer(
    request: Mapping[str, Any],
    config: AnswerConfig = DEFAULT_CONFIG,
    *,
    default_max_tokens: int | None = None,
    prompt_tokens: int | None = None,
) -> SimAnswer:
    """The simulated model's answer to a ``/v1/chat/completions`` request body.

    ``default_max_tokens`` applies when the request sets no limit (the server passes
    context length minus prompt length); ``prompt_tokens`` overrides the simulated count.
    """
    messages = list(request.get("messages") or ())
    tools = list(request.get("tools") or ())
    digest = answer_seed(request)
    kind = _degenerate(digest, config.degenerate_rate)
    rng = random.Random(int.from_bytes(digest[:16], "big"))
    sigma = config.length_sigma
    mu = math.log(config.mean) - sigma * sigma / 2
    drawn = config.mean
    if sigma:
        z = rng.gauss(0.0, 1.0)  # the request's own draw (as rng.gauss(mu, sigma) consumes it)
        share = config.prompt_share
        zp = request_prompt_z(request) if share else None
        if zp is not None:
            z = math.sqrt(share) * zp + math.sqrt(1.0 - share) * z
        drawn = math.exp(mu + sigma * z)
    total = max(1, round(drawn))
    thinking = thinking_enabled(request)
    n_reason = max(1, round(total * rng.uniform(0.3, 0.8))) if thinking else 0
    n_content = max(1, total - n_reason)
    calls: tuple[SimToolCall, ...] = ()
    if kind is None and tools and rng.random() < config.tool_call_rate:
        calls = _tool_calls(rng, tools, messages)
        if calls:
            n_content = min(n_content, rng.randint(0, 12))
    text_rng = random.Random(rng.getrandbits(64))
    cap = requested_max_tokens(request)
    if cap is None:
        cap = default_max_tokens
    n_prompt = count_prompt_tokens(messages, tools) if prompt_tokens is None else prompt_tokens
    if kind == "loop":
        limit = max(0, cap if cap is not None else max(256, 8 * total))
        looped = _loop_pieces(text_rng, min(limit // 4, max(1, total // 2)), limit)
        reasoning, content = (looped, []) if thinking else ([], looped)
        return SimAnswer("".join(reasoning), "".join(content), (), "length", tuple(reasoning),
                         tuple(content), 0, n_prompt, kind)  # fmt: skip
    reasoning = _sentence_pieces(text_rng, n_reason)
    if kind == "empty":
        content = []
    elif kind == "language":
        n_content = max(n_content, LANGUAGE_MIN_TOKENS)  # a whole answer, in another script
        content = _foreign_pieces(text_rng, n_content, last_user_text(messages) or "")
    else:
        content = _sentence_pieces(text_rng, n_content)
    tool_tokens = SECTION_TOKENS + sum(c.tokens for c in calls) if calls else 0

    finish = "tool_calls" if calls else "stop"
    if cap is not None and len(reasoning) + len(content) + tool_tokens > cap:
        cap = max(cap, 0)
        finish = "length"
        reasoning = reasoning[:cap]
        content = content[: max(0, cap - len(reasoning))]
        calls = ()
        # a cut tool-call section is not shown (the parser holds it back) but its tokens
        # were generated: count them so the answer uses exactly `cap` tokens.
        tool_tokens = cap - len(reasoning) - len(content)
    return SimAnswer(
        reasoning="".join(reasoning),
        content="".join(content),
        tool_calls=calls,
        finish_reason=finish,
        reasoning_pieces=tuple(reasoning),
        content_pieces=tuple(content),
        tool_tokens=tool_tokens,
        prompt_tokens=n_prompt,
        degenerate=kind,
    )


#: the kinds of degenerate answers and their shares among them (module docstring)
DEGENERATE_KINDS: tuple[tuple[str, float], ...] = (("loop", 0.4), ("empty", 0.3), ("language", 0.3))

#: content tokens of an answer that switches script at least (one letter is one token)
LANGUAGE_MIN_TOKENS = 64
#: words of the answers that switch script
_CYRILLIC = (
    "это", "модель", "ответ", "значение", "сервер", "запрос", "потому", "что", "данные", "время",
    "результат", "проверка", "когда", "можно", "нужно", "также", "только", "после", "между",
    "каждый", "первый", "второй", "здесь", "очень", "просто", "решение", "задача", "пример",
    "число", "поэтому",
)  # fmt: skip
_HAN = (
    "这个", "模型", "回答", "数值", "服务器", "请求", "因为", "所以", "数据", "时间",
    "结果", "检查", "可以", "需要", "也是", "只有", "之后", "每个", "第一", "第二",
    "这里", "非常", "简单", "解决", "问题", "例子", "数字", "我们", "他们", "然后",
)  # fmt: skip
_HAS_CYRILLIC = re.compile("[\u0400-\u04ff]")


def degenerate_kind(request: Mapping[str, Any], rate: float) -> str | None:
    """The degenerate kind :func:`answer` gives ``request`` at ``rate`` (None: a normal answer)."""
    return _degenerate(answer_seed(request), rate)


def _degenerate(digest: bytes, rate: float) -> str | None:
    if rate <= 0:
        return None
    draw = hashlib.sha256(b"degenerate\x00" + digest).digest()
    if int.from_bytes(draw[:8], "big") / 2**64 >= rate:
        return None
    v = int.from_bytes(draw[8:16], "big") / 2**64
    acc = 0.0
    for kind, share in DEGENERATE_KINDS:
        acc += share
        if v < acc:
            return kind
    return DEGENERATE_KINDS[-1][0]


def _loop_pieces(rng: random.Random, prefix: int, n: int) -> list[str]:
    """``prefix`` tokens of normal text, then one short sentence again and again: ``n`` tokens."""
    pieces = _sentence_pieces(rng, prefix)
    words = [_WORDS[int(rng.random() * len(_WORDS))] for _ in range(4 + int(rng.random() * 9))]
    unit = split_pieces(" " + " ".join([words[0].capitalize(), *words[1:]]) + ".")
    while len(pieces) < n:
        pieces.extend(unit)
    return pieces[:n]


def _foreign_pieces(rng: random.Random, n: int, prompt: str) -> list[str]:
    """Exactly ``n`` tokens of text in another script than ``prompt``'s (module docstring)."""
    han = bool(_HAS_CYRILLIC.search(prompt))
    words, sep, stop = (_HAN, "", "。") if han else (_CYRILLIC, " ", ".")
    pieces: list[str] = []
    left = 5 + int(rng.random() * 8)
    while len(pieces) < n:
        pieces.extend(split_pieces((sep if pieces else "") + rng.choice(words)))
        left -= 1
        if left <= 0:
            pieces.append(stop)
            left = 5 + int(rng.random() * 8)
    return pieces[:n]
