"""Which requests one sample needs, and the history each of them carries.

Owns no files. ``turns: all`` regenerates every assistant turn on-policy: the history of turn k
carries our regenerated replies of turns < k (content, reasoning_content, tool_calls) and the
original user/tool messages; what the server actually sees of them is the chat template's
business.

Tool turns stay on-policy: the source's original tool results are kept only while they answer
the calls our reply made. After an original assistant turn that called tools, the conversation
continues only when our reply made the same calls: as many, in the same order, each with the
same function name and the same arguments compared as parsed JSON (``{"a": 1, "b": 2}`` equals
``{"b":2,"a":1}``; arguments that do not parse as JSON are compared as text). The calls
compared are what the engine's tool-call parser returned (SGLang's or vLLM's ``kimi_k2``:
tests/contract/test_turn_matching.py and tests/engines/test_vllm_turns.py hold both). When they
match, the tool results are re-addressed to our call ids, in order. Otherwise the conversation
ends at that turn: the turns done so far are the sample's rows, and :attr:`Regenerated.ended`
says why (one of :data:`END_REASONS`; the worker writes it on the sample's last row, column
``ended``, and the run's counters count it per source). A reply cut by ``max_tokens``
(``finish_reason: length``) also ends the conversation, counted as truncated, not here; so does
a reply regen cut because it looped (``loop``, regen.quality.loop), counted as cut.

``turns: last`` keeps the original prefix (tool results included) and regenerates the final
assistant turn. A prompt-only sample (no assistant turn) gets one turn in either mode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from regen.core import jsontext
from regen.core.chat import MessageJson
from regen.core.result import TurnResult
from regen.core.sample import Message, Sample, ToolCall

#: one request's messages, as OpenAI JSON (regen.core.sample.Message.to_openai)
Request = list[MessageJson]
#: a sample's tool declarations, as OpenAI JSON
Tools = Sequence[Mapping[str, object]]
#: (request messages, tools) -> the regenerated turn
Complete = Callable[[Request, Tools | None], Awaitable[TurnResult]]

#: why a conversation ended before its last assistant turn
TOOL_CALLS_UNEXPECTED = "tool_calls_unexpected"  #: our reply called tools, the original did not
TOOL_CALLS_MISSING = "tool_calls_missing"  #: the original called tools, our reply did not
TOOL_CALL_COUNT = "tool_call_count"  #: both called tools, not as many
TOOL_CALL_NAME = "tool_call_name"  #: a call names another function
TOOL_CALL_ARGUMENTS = "tool_call_arguments"  #: a call passes other arguments
END_REASONS = (
    TOOL_CALLS_UNEXPECTED,
    TOOL_CALLS_MISSING,
    TOOL_CALL_COUNT,
    TOOL_CALL_NAME,
    TOOL_CALL_ARGUMENTS,
)


@dataclass(slots=True)
class DoneTurn:
    """One regenerated turn with the exact request messages that produced it."""

    turn: int  #: ordinal of the assistant turn in the conversation (0-based)
    request_messages: Request
    result: TurnResult


@dataclass(slots=True)
class Regenerated:
    """The turns of one sample, and why the conversation ended early (None: it did not)."""

    turns: list[DoneTurn] = field(default_factory=list)
    ended: str | None = None


def reply_message(result: TurnResult) -> Message:
    """Our regenerated reply as a history message."""
    return Message(
        role="assistant",
        content=result.content,
        reasoning=result.reasoning,
        tool_calls=result.tool_calls,
    )


def _arguments(text: str) -> tuple[str, object]:
    """Arguments as parsed JSON (a string that does not parse stays the string)."""
    try:
        return ("json", jsontext.loads(text))
    except ValueError:
        return ("text", text)


def call_mismatch(original: Sequence[ToolCall], ours: Sequence[ToolCall]) -> str | None:
    """Why ``ours`` do not answer to the original tool results (None: every call matches)."""
    if not original:
        return TOOL_CALLS_UNEXPECTED if ours else None
    if not ours:
        return TOOL_CALLS_MISSING
    if len(ours) != len(original):
        return TOOL_CALL_COUNT
    for o, r in zip(original, ours, strict=True):
        if o.name != r.name:
            return TOOL_CALL_NAME
        if _arguments(o.arguments) != _arguments(r.arguments):
            return TOOL_CALL_ARGUMENTS
    return None


async def regenerate(sample: Sample, complete: Complete) -> Regenerated:
    """Run every request of ``sample`` in order; returns its turns (raises on a failed one)."""
    msgs = sample.messages
    n_assistant = sum(1 for m in msgs if m.role == "assistant")
    if n_assistant == 0:
        request = [m.to_openai() for m in msgs]
        return Regenerated([DoneTurn(0, request, await complete(request, sample.tools))])
    if sample.turns == "last":
        last = max(i for i, m in enumerate(msgs) if m.role == "assistant")
        request = [m.to_openai() for m in msgs[:last]]
        done = DoneTurn(n_assistant - 1, request, await complete(request, sample.tools))
        return Regenerated([done])

    out = Regenerated()
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
        out.turns.append(DoneTurn(turn, request, result))
        turn += 1
        history.append(reply_message(result))
        if result.unfinished:
            break  # a cut reply: later turns would follow a history no server produces
        why = call_mismatch(m.tool_calls, result.tool_calls)
        if why is not None:
            # the original results (or the original's next turn) answer other calls than ours:
            # any later turn would be trained on a history the model never sees when serving
            if turn < n_assistant:
                out.ended = why
            break
        id_map = {o.id: r.id for o, r in zip(m.tool_calls, result.tool_calls, strict=True)}
    return out
