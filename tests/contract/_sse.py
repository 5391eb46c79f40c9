"""Feed an SSE body to two StreamAccumulators, fast path on and off, and compare them.

The fast path (regen.client.stream) must be invisible: for any body, both accumulators end in
the same state, or both raise the same error type at the same line.
"""

from __future__ import annotations

import itertools
from typing import Any

from regen.client.stream import StreamAccumulator


def outcome(lines: list[bytes], *, fast: bool) -> tuple[Any, ...]:
    """Everything an accumulator exposes after ``lines`` (or the error and the line it hit)."""
    acc = StreamAccumulator(endpoint="http://127.0.0.1:1/v1", clock=itertools.count(1).__next__,
                            fast=fast)  # fmt: skip
    for i, line in enumerate(lines):
        try:
            acc.feed_bytes(line)
        except Exception as e:
            return ("error", i, type(e), getattr(e, "status", None), acc.chunks, acc.fast_chunks)
        if acc.done:
            break
    state = (
        acc.content, acc.reasoning, acc.tool_calls(), acc.finish_reason, acc.model, acc.usage,
        acc.first_token_at, acc.chunks, acc.done, acc.prompt_ids, acc.output_ids, acc.spec,
    )  # fmt: skip
    return ("ok", state, acc.fast_chunks)


def assert_same(body: bytes) -> int:
    """Both paths agree on ``body`` (split on newlines as the transport does); returns how many
    chunks the fast path took."""
    lines = body.split(b"\n")
    full, fast = outcome(lines, fast=False), outcome(lines, fast=True)
    assert full[:-1] == fast[:-1], (full, fast)
    assert full[-1] == 0
    return fast[-1]
