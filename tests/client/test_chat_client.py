"""ChatClient against a scripted local server: what it sends, what it assembles, how it fails.

Every test goes through the production transport (aiohttp over a real loopback socket)."""

from __future__ import annotations

import asyncio
import json

import pytest
from _chat_fakes import (
    MESSAGES,
    MODEL,
    OK_CHUNKS,
    Drop,
    ScriptedServer,
    Stall,
    chunk,
    closed_port_url,
    complete,
    cut_response,
    error_response,
    make_client,
    stream_response,
)
from _scripted import Reply, json_reply

from regen.client import resolve_api_key
from regen.core.errors import (
    ConfigError,
    ConnectError,
    ContextLengthError,
    EndpointFaultError,
    NotProtocolError,
    OverloadedError,
    PermanentError,
    RateLimitedError,
    RequestTimeoutError,
    ServerError,
    StreamCutError,
)
from regen.manifest import Endpoint, Sampling

# ---- what is sent -----------------------------------------------------------------------------


def test_streaming_request_carries_sampling_template_kwargs_and_asks_for_ids():
    script = ScriptedServer(stream_response(OK_CHUNKS))
    sampling = Sampling(
        temperature=0.3,
        top_p=0.9,
        max_tokens=77,
        thinking=False,
        chat_template_kwargs={"x": 1},
        top_k=20,
        seed=5,
    )
    # the family's thinking switch comes from the manifest (Manifest.template_kwargs), the
    # sampling's own chat_template_kwargs win over it
    complete(script, sampling=sampling, template_kwargs={"thinking": False, "x": 1})
    (body,) = script.bodies()
    assert body["model"] == MODEL
    assert body["messages"] == MESSAGES
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (body["temperature"], body["top_p"], body["max_completion_tokens"]) == (0.3, 0.9, 77)
    assert "max_tokens" not in body
    assert body["top_k"] == 20 and body["seed"] == 5
    assert body["chat_template_kwargs"] == {"thinking": False, "x": 1}
    # the server's exact ids by default, streamed through SGLang's sglext
    assert body["return_input_ids_in_sglext"] is body["return_output_ids_in_sglext"] is True
    assert "return_token_ids" not in body and "return_prompt_token_ids" not in body
    assert script.requests[0].path == "/v1/chat/completions"


def test_local_mode_and_servers_without_sglang_ask_for_no_ids():
    for kw in ({"sampling": Sampling(token_ids="local")}, {"engine": "openai"}):
        script = ScriptedServer(stream_response(OK_CHUNKS))
        complete(script, **kw)
        (body,) = script.bodies()
        assert body["stream"] is True
        assert not any(k.startswith("return_") for k in body), body


def test_unset_top_k_and_seed_are_not_sent_and_tools_are():
    script = ScriptedServer(stream_response(OK_CHUNKS))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    complete(script, tools)
    (body,) = script.bodies()
    assert "top_k" not in body and "seed" not in body
    assert body["tools"] == tools
    # no family given (a client built without a manifest): no thinking switch is guessed
    assert body["chat_template_kwargs"] == {}


# ---- what is assembled ------------------------------------------------------------------------


def test_stream_assembles_content_reasoning_and_usage_in_last_chunk():
    chunks = [
        chunk(role="assistant", reasoning="Let me "),
        chunk(reasoning="think."),
        chunk(content="Hi"),
        chunk(content=" there", finish="stop"),
        chunk(
            choices=False,
            usage={
                "prompt_tokens": 11,
                "completion_tokens": 6,
                "total_tokens": 17,
                "reasoning_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
        ),
    ]
    script = ScriptedServer(stream_response(chunks))
    r = complete(script)
    assert r.content == "Hi there"
    assert r.reasoning == "Let me think."
    assert r.finish_reason == "stop"
    assert (r.prompt_tokens, r.completion_tokens) == (11, 6)
    assert (r.reasoning_tokens, r.cached_tokens) == (3, 8)
    assert r.model == MODEL and r.endpoint == script.url and r.attempts == 1
    assert r.tool_calls == ()
    assert r.prompt_token_ids is None and r.output_token_ids is None


def test_stream_reads_the_ids_from_the_sglext_chunk():
    chunks = [
        chunk(content="Hi", finish="stop"),
        {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
         "choices": [], "sglext": {"input_ids": [1, 2, 3], "output_ids": [[7, 8, 9]]}},
        chunk(choices=False, usage={"prompt_tokens": 3, "completion_tokens": 3}),
    ]  # fmt: skip
    r = complete(ScriptedServer(stream_response(chunks)))
    assert (r.prompt_token_ids, r.output_token_ids) == ([1, 2, 3], [7, 8, 9])
    assert r.ttft_s is not None


def test_stream_usage_on_the_finish_reason_chunk_and_no_done_marker():
    chunks = [
        chunk(content="a"),
        chunk(
            content="b",
            finish="length",
            usage={"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
        ),
    ]
    r = complete(ScriptedServer(stream_response(chunks, done=False)))
    assert (r.content, r.finish_reason, r.truncated) == ("ab", "length", True)
    assert (r.prompt_tokens, r.completion_tokens) == (4, 2)
    assert r.reasoning is None


def test_tool_calls_are_assembled_from_deltas():
    def tc(index, *, id=None, name=None, args=None):
        fn = {}
        if name is not None:
            fn["name"] = name
        if args is not None:
            fn["arguments"] = args
        d = {"index": index, "function": fn}
        if id is not None:
            d["id"], d["type"] = id, "function"
        return d

    chunks = [
        chunk(content="Calling."),
        chunk(tool_calls=[tc(0, id="functions.get:0", name="get", args="")]),
        chunk(tool_calls=[tc(0, args='{"city": ')]),
        chunk(tool_calls=[tc(0, args='"Oslo"}')]),
        chunk(tool_calls=[tc(1, id="functions.put:1", name="put", args='{"k": 1}')]),
        chunk(finish="tool_calls"),
        chunk(choices=False, usage={"prompt_tokens": 9, "completion_tokens": 12}),
    ]
    r = complete(ScriptedServer(stream_response(chunks)))
    assert r.finish_reason == "tool_calls"
    assert r.content == "Calling."
    assert [(c.id, c.name, c.arguments) for c in r.tool_calls] == [
        ("functions.get:0", "get", '{"city": "Oslo"}'),
        ("functions.put:1", "put", '{"k": 1}'),
    ]


def test_latency_and_ttft_use_the_clock():
    ticks = iter([100.0, 100.5, 103.0])  # request start, first token ("Hello"), end
    r = complete(ScriptedServer(stream_response(OK_CHUNKS)), clock=lambda: next(ticks))
    assert r.ttft_s == pytest.approx(0.5)
    assert r.latency_s == pytest.approx(3.0)


def _whole(choice_extra: dict, top_extra: dict | None = None, finish: str | None = "stop"):
    return {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "finish_reason": finish,
                "message": {"role": "assistant", "content": "ok", "reasoning_content": "hm"},
                **choice_extra,
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
        **(top_extra or {}),
    }


@pytest.mark.parametrize(
    ("engine", "choice_extra", "top_extra", "asked"),
    [
        ("sglang", {"prompt_token_ids": [1, 2, 3], "response_token_ids": [7, 8, 9, 10]}, None,
         {"return_prompt_token_ids": True, "return_token_ids": True}),
        ("vllm", {"token_ids": [7, 8, 9, 10]}, {"prompt_token_ids": [1, 2, 3]},
         {"return_token_ids": True}),
    ],
)  # fmt: skip
def test_non_streaming_asks_for_and_reads_server_token_ids(engine, choice_extra, top_extra, asked):
    script = ScriptedServer(json_reply(200, _whole(choice_extra, top_extra)))
    r = complete(script, sampling=Sampling(token_ids="nonstream"), engine=engine)
    (sent,) = script.bodies()
    assert "stream" not in sent and "stream_options" not in sent
    assert {k: v for k, v in sent.items() if k.startswith("return_")} == asked
    assert (r.content, r.reasoning, r.finish_reason) == ("ok", "hm", "stop")
    assert r.prompt_token_ids == [1, 2, 3]
    assert r.output_token_ids == [7, 8, 9, 10]
    assert r.engine == engine
    assert (r.prompt_tokens, r.completion_tokens, r.ttft_s) == (3, 4, None)


# ---- how it fails (mapped by type and status) -------------------------------------------------


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (Drop(), ConnectError),
        (Stall(3.0), RequestTimeoutError),
        (error_response(408), ServerError),
        (error_response(500), ServerError),
        (error_response(502), ServerError),
        (error_response(503), OverloadedError),
        (error_response(429), RateLimitedError),
        (error_response(400), PermanentError),
        (error_response(401, {"error": "Unauthorized"}), EndpointFaultError),
        (error_response(403), EndpointFaultError),
        (error_response(404), EndpointFaultError),
        (error_response(422, {"detail": "Unexpected fields"}), PermanentError),
        (error_response(413), ContextLengthError),
        (
            error_response(
                400, {"error": {"message": "too long", "code": "context_length_exceeded"}}
            ),
            ContextLengthError,
        ),
        (Reply(200, b"not json"), NotProtocolError),
    ],
)
def test_errors_map_by_type_and_status(step, expected):
    script = ScriptedServer(step)
    sampling = Sampling(token_ids="nonstream") if isinstance(step, Reply) and step.status == 200 \
        else None  # fmt: skip
    with pytest.raises(expected) as info:
        complete(script, timeout_s=0.3, sampling=sampling)
    assert type(info.value) is expected
    assert info.value.endpoint == script.url
    if isinstance(step, Reply) and step.status != 200:
        assert info.value.status == step.status


def test_a_refused_connection_is_a_connect_error():
    url = closed_port_url()
    client = make_client(url)

    async def go():
        try:
            return await client.complete(MESSAGES, None, sample_id="s")
        finally:
            await client.aclose()

    with pytest.raises(ConnectError):
        asyncio.run(go())


def test_context_length_is_not_guessed_from_message_text():
    body = {"object": "error", "message": "maximum context length exceeded", "code": 400}
    with pytest.raises(PermanentError) as info:
        complete(ScriptedServer(error_response(400, body)))
    assert type(info.value) is PermanentError
    assert "maximum context length" in str(info.value)  # the reason is kept for the record


def test_stream_without_finish_reason_is_a_stream_cut():
    with pytest.raises(StreamCutError):
        complete(ScriptedServer(stream_response([chunk(content="partial")])))


def test_connection_dropped_mid_stream_is_a_stream_cut():
    with pytest.raises(StreamCutError):
        complete(ScriptedServer(cut_response([chunk(content="part")])))


def test_error_object_inside_the_stream():
    bad = [chunk(content="a"), {"error": {"message": "engine died", "code": 500}}]
    with pytest.raises(ServerError):
        complete(ScriptedServer(stream_response(bad)))
    busy = [chunk(content="a"), {"error": {"message": "retracted", "code": 503}}]
    with pytest.raises(OverloadedError):
        complete(ScriptedServer(stream_response(busy)))
    plain = [chunk(content="a"), {"error": "something broke"}]
    with pytest.raises(ServerError):
        complete(ScriptedServer(stream_response(plain)))
    rejected = [{"error": {"message": "bad request", "code": 400}}]
    with pytest.raises(PermanentError):
        complete(ScriptedServer(stream_response(rejected)))


# ---- the API key --------------------------------------------------------------------------------


def test_api_key_from_env_is_sent_and_never_in_errors(monkeypatch):
    secret = "sk-very-secret-123"
    monkeypatch.setenv("REGEN_TEST_KEY", secret)
    script = ScriptedServer(error_response(401, {"error": "Unauthorized"}))
    with script.running():
        ep = Endpoint(url=script.url, api_key_env="REGEN_TEST_KEY")
        client = make_client(script.url, endpoint=ep)

        async def go():
            try:
                return await client.complete(MESSAGES, None, sample_id="s")
            finally:
                await client.aclose()

        with pytest.raises(EndpointFaultError) as info:
            asyncio.run(go())
    assert script.requests[0].headers["Authorization"] == f"Bearer {secret}"
    assert secret not in str(info.value) and secret not in repr(info.value)
    assert "Unauthorized" in str(info.value)
    # no chained exception (whose request would hold the key) travels with it
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__


def test_api_key_from_file_relative_to_base_dir(tmp_path):
    (tmp_path / "key.txt").write_text("file-key\n")
    assert resolve_api_key(Endpoint(url="http://h/v1", api_key_file="key.txt"), tmp_path) == (
        "file-key"
    )
    script = ScriptedServer(stream_response(OK_CHUNKS))
    with script.running():
        ep = Endpoint(url=script.url, api_key_file="key.txt")
        client = make_client(script.url, endpoint=ep, base_dir=tmp_path)

        async def go():
            try:
                return await client.complete(MESSAGES, None, sample_id="s")
            finally:
                await client.aclose()

        asyncio.run(go())
    assert script.requests[0].headers["Authorization"] == "Bearer file-key"


def test_no_key_sends_no_authorization_header():
    script = ScriptedServer(stream_response(OK_CHUNKS))
    complete(script)
    assert "Authorization" not in script.requests[0].headers


def test_missing_key_source_is_a_config_error(monkeypatch, tmp_path):
    monkeypatch.delenv("REGEN_TEST_NO_KEY", raising=False)
    url = "http://h:1/v1"
    with pytest.raises(ConfigError, match="REGEN_TEST_NO_KEY"):
        resolve_api_key(Endpoint(url=url, api_key_env="REGEN_TEST_NO_KEY"))
    with pytest.raises(ConfigError, match="api_key_file"):
        resolve_api_key(Endpoint(url=url, api_key_file="nope.txt"), tmp_path)
    assert resolve_api_key(Endpoint(url=url)) == ""


def test_messages_are_sent_verbatim():
    script = ScriptedServer(stream_response(OK_CHUNKS))
    msgs = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "t0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "content": "res", "tool_call_id": "t0"},
    ]
    complete(script, messages=msgs)
    assert script.requests[0].json()["messages"] == msgs


def test_sse_comments_event_lines_and_blank_data_are_ignored():
    events = [
        ": keep-alive\n\n",
        "event: message\n",
        f"data: {json.dumps(chunk(content='A'))}\n\n",
        "data:\n\n",
        "id: 7\n",
        f"data:{json.dumps(chunk(content='B', finish='stop'))}\n\n",
        "data: [DONE]\n\n",
        f"data: {json.dumps(chunk(content='after done'))}\n\n",
    ]
    r = complete(ScriptedServer(Reply(200, "".join(events).encode())))
    assert (r.content, r.finish_reason) == ("AB", "stop")
    assert r.prompt_tokens is None  # the server sent no usage


@pytest.mark.parametrize(
    ("finish", "error"), [("abort", ServerError), ("content_filter", PermanentError)]
)
def test_a_turn_that_did_not_finish_is_never_stored_as_finished(finish, error):
    chunks = [chunk(content="half an ans"), chunk(finish=finish)]
    with pytest.raises(error, match=f"finish_reason='{finish}'"):
        complete(ScriptedServer(stream_response(chunks)))


@pytest.mark.parametrize(("finish", "error"), [(None, ServerError), ("abort", ServerError)])
def test_non_streaming_without_a_real_finish_reason_is_retried(finish, error):
    script = ScriptedServer(json_reply(200, _whole({}, finish=finish)))
    with pytest.raises(error):
        complete(script, sampling=Sampling(token_ids="nonstream"))
