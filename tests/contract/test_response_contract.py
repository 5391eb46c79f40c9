"""Responses built by SGLang's own models, serialized as SGLang serializes them, go through
regen's real transport and parsers (a scripted loopback server replays the bytes).

Non-streamed answers: ``ChatCompletionResponse.model_dump_json(by_alias=True)`` (SGLang's
``model_json_response``). Streams: ``build_sse_content`` for role/content/reasoning/finish
chunks, ``ChatCompletionStreamResponse.model_dump_json()`` for tool-call, ``sglext`` and usage
chunks, ``{"error": ErrorResponse.model_dump()}`` for an error after HTTP 200 (all as in
``serving_chat.py`` / ``serving_base.py`` of SGLang 0.5.23), then ``data: [DONE]``."""

from __future__ import annotations

import asyncio
import json
from types import ModuleType
from typing import Any

import pytest
from _scripted import Reply, ScriptedServer
from _sse import assert_same

from regen.client import ChatClient, RetryPolicy
from regen.core.errors import OverloadedError, PermanentError, ServerError
from regen.manifest import Endpoint, Sampling

MODEL = "moonshotai/Kimi-K2.5"
CID = "chatcmpl-contract"
MSGS = [{"role": "user", "content": "Weather in Oslo?"}]
SSE = {"Content-Type": "text/event-stream"}


def run(step: Reply, token_ids: str = "stream") -> Any:
    if step.headers.get("Content-Type") == SSE["Content-Type"]:
        assert_same(step.body)  # the fast path and the full parse agree on every stream here
    server = ScriptedServer(step)
    with server.running():
        client = ChatClient(Endpoint(url=server.url), model=MODEL,
                            sampling=Sampling(token_ids=token_ids),
                            retry=RetryPolicy(max_attempts=1))  # fmt: skip

        async def go() -> Any:
            try:
                return await client.complete(MSGS, None, sample_id="c:1")
            finally:
                await client.aclose()

        return asyncio.run(go())


class Stream:
    """An SSE body assembled with SGLang's own serializers."""

    def __init__(self, p: ModuleType, sse: ModuleType) -> None:
        self.p, self.sse, self.parts = p, sse, []  # type: list[str]

    def content(self, **kw: Any) -> Stream:
        self.parts.append(self.sse.build_sse_content(CID, 0, MODEL, 0, **kw))
        return self

    def model(self, **kw: Any) -> Stream:
        chunk = self.p.ChatCompletionStreamResponse(id=CID, created=0, model=MODEL, **kw)
        self.parts.append(f"data: {chunk.model_dump_json()}\n\n")
        return self

    def tool_delta(self, index: int, **fn: Any) -> Stream:
        p = self.p
        call = p.ToolCall(id=fn.pop("id", None), index=index, function=p.FunctionResponse(**fn))
        choice = p.ChatCompletionResponseStreamChoice(
            index=0, delta=p.DeltaMessage(tool_calls=[call]), finish_reason=None
        )
        return self.model(choices=[choice])

    def usage(self, **kw: Any) -> Stream:
        return self.model(choices=[], usage=self.p.UsageInfo(**kw))

    def error(self, message: str, err_type: str, code: int) -> Stream:
        err = self.p.ErrorResponse(object="error", message=message, type=err_type, param=None,
                                   code=code)  # fmt: skip
        self.parts.append(f"data: {json.dumps({'error': err.model_dump()})}\n\n")
        return self

    def reply(self) -> Reply:
        return Reply(200, ("".join(self.parts) + "data: [DONE]\n\n").encode(), dict(SSE))


@pytest.fixture
def stream(protocol, sse_utils):
    return lambda: Stream(protocol, sse_utils)


def test_streamed_reasoning_content_usage_chunk_and_sglext_ids(protocol, stream) -> None:
    p = protocol
    spec = p.SpecTokensDetails(spec_accept_length=2.5, spec_verify_ct=2, spec_accept_rate=0.5)
    body = (
        stream()
        .content(role="assistant", content="")
        .content(reasoning_content="Check ")
        .content(reasoning_content="the sky.")
        .content(content="\n\nIt rains.")
        .content(finish_reason="stop", matched_stop=163586)
        .model(
            choices=[],
            sglext=p.SglExt(
                input_ids=[1, 2, 3], output_ids=[[9, 8, 7, 163586]], spec_tokens_details=spec
            ),
        )
        .usage(
            prompt_tokens=3,
            completion_tokens=4,
            total_tokens=7,
            reasoning_tokens=2,
            prompt_tokens_details=p.PromptTokensDetails(cached_tokens=2),
        )
    )
    r = run(body.reply())
    assert (r.reasoning, r.content, r.finish_reason) == ("Check the sky.", "\n\nIt rains.", "stop")
    assert (r.prompt_token_ids, r.output_token_ids) == ([1, 2, 3], [9, 8, 7, 163586])
    assert (r.prompt_tokens, r.completion_tokens, r.reasoning_tokens, r.cached_tokens) == (
        3, 4, 2, 2)  # fmt: skip
    assert r.ttft_s is not None


def test_streamed_tool_calls_with_kimi_ids(stream) -> None:
    body = (
        stream()
        .content(role="assistant", content="")
        .content(reasoning_content="Need the tool.")
        .tool_delta(0, id="functions.get_weather:0", name="get_weather", arguments="")
        .tool_delta(0, arguments='{"city": ')
        .tool_delta(0, arguments='"Oslo"}')
        .tool_delta(1, id="functions.get_time:1", name="get_time", arguments="{}")
        .content(finish_reason="tool_calls")
        .usage(prompt_tokens=5, completion_tokens=20, total_tokens=25)
    )
    r = run(body.reply(), token_ids="local")
    assert r.finish_reason == "tool_calls" and r.content == ""
    assert [(c.id, c.name, c.arguments) for c in r.tool_calls] == [
        ("functions.get_weather:0", "get_weather", '{"city": "Oslo"}'),
        ("functions.get_time:1", "get_time", "{}"),
    ]
    assert r.prompt_token_ids is None  # none asked, none sent


@pytest.mark.parametrize(
    ("err_type", "code", "expected"),
    [
        ("SERVICE_UNAVAILABLE", 503, OverloadedError),
        ("BAD_REQUEST", 400, PermanentError),
        ("INTERNAL_SERVER_ERROR", 500, ServerError),
    ],
)
def test_an_error_inside_the_stream_after_http_200(stream, err_type, code, expected) -> None:
    """SGLang aborts a streamed request with a status (queue full, timeout, retraction) by an
    error event after HTTP 200, then still sends usage and [DONE]."""
    body = (
        stream()
        .content(role="assistant", content="")
        .content(content="partial ")
        .error(
            "Retracted under decode memory pressure without a KV backup. Retry later.",
            err_type,
            code,
        )
        .usage(prompt_tokens=3, completion_tokens=1, total_tokens=4)
    )
    with pytest.raises(expected) as info:
        run(body.reply())
    assert type(info.value) is expected and info.value.status == code


def test_finish_reason_abort_is_retried_not_stored(stream) -> None:
    body = stream().content(role="assistant", content="").content(content="half").content(
        finish_reason="abort")  # fmt: skip
    with pytest.raises(ServerError, match="abort"):
        run(body.reply())


def test_non_streamed_answer_with_ids_on_the_choice(protocol) -> None:
    p = protocol
    call = p.ToolCall(
        id="functions.get_weather:0",
        index=0,
        function=p.FunctionResponse(name="get_weather", arguments='{"city":"Oslo"}'),
    )
    choice = p.ChatCompletionResponseChoice(
        index=0,
        message=p.ChatMessage(
            role="assistant", content="", reasoning_content="Tool time.", tool_calls=[call]
        ),
        finish_reason="tool_calls",
        matched_stop=None,
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[5, 6, 163586],
    )
    resp = p.ChatCompletionResponse(
        id=CID,
        model=MODEL,
        choices=[choice],
        usage=p.UsageInfo(prompt_tokens=3, completion_tokens=3, total_tokens=6, reasoning_tokens=1),
    )
    raw = resp.model_dump_json(by_alias=True).encode()
    assert b'"content":""' in raw and b'"prompt_token_ids":[1,2,3]' in raw
    r = run(Reply(200, raw), token_ids="nonstream")
    assert (r.content, r.reasoning, r.finish_reason) == ("", "Tool time.", "tool_calls")
    assert [(c.id, c.name, c.arguments) for c in r.tool_calls] == [
        ("functions.get_weather:0", "get_weather", '{"city":"Oslo"}')
    ]
    assert (r.prompt_token_ids, r.output_token_ids) == ([1, 2, 3], [5, 6, 163586])
    assert (r.prompt_tokens, r.completion_tokens, r.reasoning_tokens) == (3, 3, 1)


@pytest.mark.parametrize(
    ("status", "err_type", "message", "expected"),
    [
        (
            400,
            "BadRequestError",
            "The input (300000 tokens) is longer than the model's context length (262144 tokens).",
            PermanentError,
        ),
        (503, "503", "The request queue is full.", OverloadedError),
    ],
)
def test_top_level_error_bodies(protocol, status, err_type, message, expected) -> None:
    err = protocol.ErrorResponse(object="error", message=message, type=err_type, code=status)
    with pytest.raises(expected) as info:
        run(Reply(status, json.dumps(err.model_dump()).encode()), token_ids="nonstream")
    assert type(info.value) is expected and info.value.status == status
    assert message[:40] in str(info.value)
    assert getattr(info.value, "retry_after", None) is None  # SGLang never sends Retry-After
