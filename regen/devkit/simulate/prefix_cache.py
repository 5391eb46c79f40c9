"""A server's prefix cache: LRU over token prefixes, with a capacity in tokens.

Both engines keep the KV of finished requests and reuse it for a later prompt that starts with
the same tokens: SGLang's radix tree (``mem_cache/radix_cache.py``: ``match_prefix`` on
``input_ids``, ``cache_finished_req`` inserts prompt and output, leaves evicted least recently
used first) and vLLM's block hashes (``v1/core/kv_cache_manager.py``: full blocks of
``block_size`` tokens, chained hashes, a free queue in LRU order). This module is the same idea
over *segments*: a prompt is a sequence of ``(key, tokens)`` pairs, held in a tree whose nodes
are segments; a prompt's cached prefix is the run of segments from the root that the tree
holds. What the engines report as cached is then

    ``cached = floor(min(common, prompt - 1) / block_size) * block_size``

(``common``: tokens of the matched segments; both engines compute at least the prompt's last
token, vLLM's ``max_cache_hit_length = num_tokens - 1``; vLLM hits only whole blocks, SGLang's
default page size is 1).

Two ways to cut a prompt into segments:

- :func:`token_segments`: real token ids (a simulator with ``--tokenizer``, the vLLM check of
  tests/engines): segments of ``max(block_size, MIN_ID_SEGMENT)`` ids, so a match is exact to
  that many tokens;
- :func:`message_segments`: no tokenizer, the simulator's word-piece counts
  (:mod:`regen.devkit.simulate.tokens`): one segment per tool list and per message, keyed by
  its role, text and tool calls (not its reasoning, which templates drop from the history),
  and the generation prompt last. After an answer, :meth:`PrefixCache.insert` is given the
  prompt's segments without the generation prompt and the answer as an assistant message
  (:func:`answer_segment`), so the next turn, which re-sends that answer in its history,
  matches through it, as it would on an engine whose template renders the history as it
  generated it.

A ``salt`` (vLLM's ``cache_salt``) is a first segment of no tokens: prompts with different
salts share nothing, as on vLLM (the salt is hashed into the first block).

Eviction: when the tree holds more than ``capacity`` tokens, leaves go, least recently used
first (a lazy heap); a matched or inserted node is used now. The nodes one match or insert
touches lie on one path from the root, so no two leaves were last used at the same moment and
the order is the leaves' last use alone: only a path's last node, the one that can be a leaf,
enters the heap (a node whose children are all evicted enters it then). An 11,000-token prompt
of new ids costs ~2 ms of CPU in a full cache (its lookup and two inserts). Requests in flight
do not pin their prefix here (the engines lock it); with a capacity of many prompts the
difference is small. Owns no files.
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from regen.devkit.simulate.tokens import GENERATION_PROMPT, MESSAGE_OVERHEAD, count_tokens

#: one segment of a prompt: an identity and the tokens it holds
Segment = tuple[Hashable, int]

#: token-id segments are at least this long (a per-token tree of 50k-token prompts is slow)
MIN_ID_SEGMENT = 16

#: the key of the generation prompt's segment
_GEN = ("gen",)


class _Node:
    __slots__ = ("children", "key", "last", "parent", "tokens")

    def __init__(self, key: Hashable, tokens: int, parent: _Node | None) -> None:
        self.key = key
        self.tokens = tokens
        self.parent = parent
        self.children: dict[Hashable, _Node] = {}
        self.last = 0


@dataclass(slots=True)
class CacheCounters:
    """What the engines count: prompt tokens looked up and tokens found cached."""

    queries: int = 0  #: prompt tokens of the requests matched (vLLM's prefix_cache_queries)
    hits: int = 0  #: of those, tokens reported cached (vLLM's prefix_cache_hits)
    requests: int = 0
    evicted: int = 0  #: tokens evicted

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class PrefixCache:
    """LRU prefix cache of ``capacity`` tokens, reporting hits in whole ``block_size`` blocks."""

    def __init__(self, capacity: int, block_size: int = 1) -> None:
        if capacity < 0 or block_size < 1:
            raise ValueError("need capacity >= 0 and block_size >= 1")
        self.capacity = capacity
        self.block_size = block_size
        self.root = _Node(None, 0, None)
        self.tokens = 0  #: tokens held
        self.nodes = 0
        self.counters = CacheCounters()
        self._clock = itertools.count(1)
        self._heap: list[tuple[int, int, _Node]] = []
        self._seq = itertools.count()

    def match(self, segments: Sequence[Segment], prompt_tokens: int | None = None) -> int:
        """Tokens of this prompt the engine finds cached (whole blocks, never the last token);
        counts the query and marks the matched prefix used."""
        n = sum(t for _, t in segments) if prompt_tokens is None else prompt_tokens
        now = next(self._clock)
        node = self.root
        common = 0
        for key, tokens in segments:
            child = node.children.get(key)
            if child is None:
                break
            child.last = now
            common += tokens
            node = child
        if node is not self.root:
            self._push(node)
        cached = min(common, max(n - 1, 0)) // self.block_size * self.block_size
        c = self.counters
        c.queries += n
        c.hits += cached
        c.requests += 1
        return cached

    def insert(self, segments: Iterable[Segment]) -> None:
        """Hold these segments (a prompt, or a prompt and its answer), then evict to capacity."""
        now = next(self._clock)
        node = self.root
        for key, tokens in segments:
            child = node.children.get(key)
            if child is None:
                child = _Node(key, tokens, node)
                node.children[key] = child
                self.tokens += tokens
                self.nodes += 1
            child.last = now
            node = child
        if node is not self.root:
            self._push(node)
        self._evict()

    def clear(self) -> None:
        """Drop everything (vLLM's ``/reset_prefix_cache``, SGLang's ``/flush_cache``)."""
        self.root = _Node(None, 0, None)
        self.tokens = self.nodes = 0
        self._heap = []

    def _push(self, node: _Node) -> None:
        if not node.children:
            heapq.heappush(self._heap, (node.last, next(self._seq), node))
            if len(self._heap) > 4 * self.nodes + 1024:  # mostly stale entries: rebuild
                self._compact()

    def _compact(self) -> None:
        self._heap = [(n.last, next(self._seq), n) for n in self._leaves()]
        heapq.heapify(self._heap)

    def _evict(self) -> None:
        if self.tokens <= self.capacity:
            return
        while self.tokens > self.capacity and self._heap:
            last, _, node = heapq.heappop(self._heap)
            parent = node.parent
            if node.children or parent is None or last != node.last:
                continue  # stale: used since, or no longer a leaf
            if parent.children.get(node.key) is not node:
                continue  # already evicted
            del parent.children[node.key]
            self.tokens -= node.tokens
            self.nodes -= 1
            self.counters.evicted += node.tokens
            if parent is not self.root and not parent.children:
                self._push(parent)

    def _leaves(self) -> Iterable[_Node]:
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(n.children.values())
            else:
                yield n


def token_segments(
    ids: Sequence[int], block_size: int = 1, salt: str | None = None
) -> list[Segment]:
    """Real token ids as segments of ``max(block_size, MIN_ID_SEGMENT)`` ids (the last may be
    shorter)."""
    size = max(block_size, MIN_ID_SEGMENT)
    out: list[Segment] = [(("salt", salt), 0)] if salt else []
    for i in range(0, len(ids), size):
        chunk = tuple(ids[i : i + size])
        out.append((chunk, len(chunk)))
    return out


def salt_of(segments: Sequence[Segment]) -> str | None:
    """The salt a prompt's segments start with (None: unsalted)."""
    if segments:
        key = segments[0][0]
        if isinstance(key, tuple) and len(key) == 2 and key[0] == "salt":
            return str(key[1])
    return None


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content
        )
    return str(content)


def _arguments(raw: Any) -> str:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return raw
    return json.dumps(raw, sort_keys=True, separators=(",", ":"))


def _calls_key(calls: Iterable[tuple[str, Any]]) -> tuple[tuple[str, str], ...]:
    return tuple((name, _arguments(args)) for name, args in calls)


def message_key(message: Mapping[str, Any]) -> Hashable:
    """A message's identity in the cache: role, text and tool calls (not reasoning)."""
    calls = []
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        calls.append((str(fn.get("name", "")), fn.get("arguments")))
    return ("msg", str(message.get("role", "")), _text(message.get("content")), _calls_key(calls))


def message_segments(
    messages: Iterable[Mapping[str, Any]],
    tools: list[Any] | None,
    salt: str | None = None,
    memo: dict[Hashable, int] | None = None,
) -> list[Segment]:
    """A prompt without a tokenizer: one segment per tool list and message, then the
    generation prompt; the tokens add up to :func:`regen.devkit.simulate.tokens.prompt_tokens`.
    ``memo`` keeps each message's count by its key (a caller that sends the same history
    again and again, as a multi-turn client does, counts each message once)."""
    from regen.devkit.simulate.tokens import prompt_tokens

    out: list[Segment] = [(("salt", salt), 0)] if salt else []
    if tools:
        text = json.dumps(tools, separators=(",", ":"))
        key: Hashable = ("tools", text)
        n = memo.get(key) if memo is not None else None
        if n is None:
            n = MESSAGE_OVERHEAD + count_tokens(text)
            if memo is not None:
                memo[key] = n
        out.append((key, n))
    for m in messages:
        key = message_key(m)
        n = memo.get(key) if memo is not None else None
        if n is None:
            n = prompt_tokens([m], None) - GENERATION_PROMPT
            if memo is not None:
                memo[key] = n
        out.append((key, n))
    out.append((_GEN, GENERATION_PROMPT))
    return out


def answer_segment(content: str, calls: Iterable[tuple[str, str]], tokens: int) -> Segment:
    """The answer as the assistant message the next turn re-sends (``tokens``: what it holds
    of the cache: its output and the generation prompt before it)."""
    return (("msg", "assistant", content, _calls_key(calls)), tokens)


def after_answer(prompt: Sequence[Segment], answer: Segment) -> list[Segment]:
    """What a finished request leaves in the cache: its prompt, the generation prompt folded
    into the answer (message segments), then the answer."""
    head = list(prompt[:-1]) if prompt and prompt[-1][0] == _GEN else list(prompt)
    return [*head, answer]
