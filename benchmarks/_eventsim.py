"""Event simulation of the capacity model with a perfect client: the bound a client reaches
in a given order. Not a test; imported by ``benchmarks/utilization.py``.

The server has R slots; every step each running request gets K tokens; a request of L tokens
needs ceil(L / K) steps; waiting requests join free slots at the start of a step in FIFO
order. The perfect client has zero latency and no in-flight limit: every conversation's first
turn is queued at step 0 in the given order, and a conversation's next turn is queued the step
after its previous turn finished. Utilization = tokens ÷ (R·K·steps).

Turn lengths are the simulator's own: :func:`chains` regenerates every conversation turn by
turn through :func:`regen.devkit.simulate.answer` with the request regen sends (our replies in the
history), so the bound is for the very answers the servers produce in the benchmark.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from regen.core.result import TurnResult
from regen.core.sample import Sample, ToolCall
from regen.devkit.simulate import AnswerConfig, answer
from regen.engine.turns import regenerate
from regen.manifest import Manifest


def chains(samples: list[Sample], manifest: Manifest, config: AnswerConfig) -> list[list[int]]:
    """Completion tokens of every turn of every sample, as the simulator answers them."""
    s = manifest.sampling

    async def one(sample: Sample) -> list[int]:
        lengths: list[int] = []

        async def complete(msgs: list[dict[str, Any]], tools: Any) -> TurnResult:
            body = {"messages": msgs, "tools": tools, "seed": s.seed, "max_tokens": s.max_tokens,
                    "chat_template_kwargs": manifest.template_kwargs()}  # fmt: skip
            a = answer(body, config)
            lengths.append(a.completion_tokens)
            calls = tuple(ToolCall(c.id, c.name, c.arguments) for c in a.tool_calls)
            return TurnResult(a.content, a.reasoning or None, calls, a.finish_reason,
                              "m", "e")  # fmt: skip

        await regenerate(sample, complete)
        return lengths

    async def all_() -> list[list[int]]:
        return [await one(x) for x in samples]

    return asyncio.run(all_())


def utilization(
    order: list[list[int]], slots: int, k: int = 1, *, continuation_first: bool = False
) -> tuple[float, int]:
    """(utilization, steps) of a perfect client sending conversations in ``order``.
    ``continuation_first``: a conversation's next turn goes ahead of every waiting first turn
    (regen: a sample keeps its slot from its first turn to its last), instead of to the back
    of the server's FIFO queue."""
    queue: collections.deque[tuple[int, int]] = collections.deque((c, 0) for c in range(len(order)))
    ready_next: dict[int, list[tuple[int, int]]] = {}
    running: list[list[int]] = []  #: [remaining tokens, conversation, turn]
    tokens = steps = 0
    total = sum(len(c) for c in order)
    finished = 0
    while finished < total:
        for item in ready_next.pop(steps, ()):
            if continuation_first:
                queue.appendleft(item)
            else:
                queue.append(item)
        while queue and len(running) < slots:
            c, t = queue.popleft()
            running.append([order[c][t], c, t])
        steps += 1
        still: list[list[int]] = []
        for r in running:
            got = min(k, r[0])
            tokens += got
            r[0] -= got
            if r[0] > 0:
                still.append(r)
                continue
            finished += 1
            c, t = r[1], r[2]
            if t + 1 < len(order[c]):
                ready_next.setdefault(steps, []).append((c, t + 1))
        running = still
    return tokens / (slots * k * steps), steps


def bounds(lengths: list[list[int]], regen_order: list[int], slots: int, k: int = 1
           ) -> dict[str, float]:  # fmt: skip
    """The perfect client's utilization: input order with a FIFO server queue (the naive
    bound), and with continuations first in input order, regen's order (``regen_order``: the
    indices in the order regen dispatches) and every length known (longest chain first)."""
    known = sorted(range(len(lengths)), key=lambda i: -sum(lengths[i]))
    runs = {
        "input order, FIFO queue": (list(range(len(lengths))), False),
        "input order, continuations first": (list(range(len(lengths))), True),
        "regen's order, continuations first": (regen_order, True),
        "lengths known, continuations first": (known, True),
    }
    return {
        name: utilization([lengths[i] for i in idx], slots, k, continuation_first=cf)[0]
        for name, (idx, cf) in runs.items()
    }
