"""Which requests one sample needs, and the history each of them carries.

Owns no files. ``turns: all`` regenerates every assistant turn on-policy: the history of turn k
carries our regenerated replies of turns < k (content, reasoning_content, tool_calls) and the
original user/tool messages; what the server actually sees of them is the chat template's
business. When an original assistant turn called tools and our reply does not make the same
number of calls, the original tool results no longer answer anything: the conversation stops
there and the turns done so far are the sample's rows. When the counts match, the tool results
are re-addressed to our call ids, in order.

``turns: last`` keeps the original prefix (tool results included) and regenerates the final
assistant turn. A prompt-only sample (no assistant turn) gets one turn in either mode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from regen.result import TurnResult
from regen.sample import Message, Sample

#: (request messages, tools) -> the regenerated turn
Complete = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], Awaitable[TurnResult]]


@dataclass(slots=True)
class DoneTurn:
    """One regenerated turn with the exact request messages that produced it."""

    turn: int  #: ordinal of the assistant turn in the conversation (0-based)
    request_messages: list[dict[str, Any]]
    result: TurnResult


def reply_message(result: TurnResult) -> Message:
    """Our regenerated reply as a history message."""
    return Message(
        role="assistant",
        content=result.content,
        reasoning=result.reasoning,
        tool_calls=result.tool_calls,
    )


async def regenerate(sample: Sample, complete: Complete) -> list[DoneTurn]:
    """Run every request of ``sample`` in order; returns its turns (raises on a failed one)."""
    msgs = sample.messages
    n_assistant = sum(1 for m in msgs if m.role == "assistant")
    if n_assistant == 0:
        request = [m.to_openai() for m in msgs]
        return [DoneTurn(0, request, await complete(request, sample.tools))]
    if sample.turns == "last":
        last = max(i for i, m in enumerate(msgs) if m.role == "assistant")
        request = [m.to_openai() for m in msgs[:last]]
        return [DoneTurn(n_assistant - 1, request, await complete(request, sample.tools))]

    done: list[DoneTurn] = []
    history: list[Message] = []
    id_map: dict[str, str] = {}
    turn = 0
    for m in msgs:
        if m.role != "assistant":
            if m.role == "tool" and m.tool_call_id in id_map:
                m = dataclasses.replace(m, tool_call_id=id_map[m.tool_call_id])
            history.append(m)
            continue
        request = [h.to_openai() for h in history]
        result = await complete(request, sample.tools)
        done.append(DoneTurn(turn, request, result))
        turn += 1
        history.append(reply_message(result))
        if result.truncated or (result.tool_calls and not m.tool_calls):
            # a cut reply, or calls that no original tool result answers: any later turn would
            # be conditioned on a history the model never sees at serving time; stop here
            break
        if m.tool_calls:
            if len(result.tool_calls) != len(m.tool_calls):
                break  # the original tool results answer calls we did not make
            id_map = {o.id: r.id for o, r in zip(m.tool_calls, result.tool_calls, strict=True)}
        else:
            id_map = {}
    return done
