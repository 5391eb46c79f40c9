"""Answers that are about the endpoint, not the sample, and answers that are not the protocol:
each is its own type (decided by status and body, never by message text), names the endpoint,
the status or content type and an excerpt of the body, and says what to fix. And an answer
whose text is not valid Unicode fails its sample as such instead of breaking a writer later."""

from __future__ import annotations

import asyncio

import pytest
from _chat_fakes import (
    MESSAGES,
    OK_CHUNKS,
    ScriptedServer,
    chunk,
    complete,
    error_response,
    make_client,
    stream_response,
)
from _scripted import Reply

from regen.core.errors import (
    EndpointFaultError,
    InvalidTextError,
    NotProtocolError,
    PermanentError,
    RequestError,
)
from regen.manifest import Sampling

HTML = b"<!DOCTYPE html>\n<html><head><title>Access denied</title></head>\n<body>Gateway says no"


@pytest.mark.parametrize("status", [401, 403, 404, 405, 407])
def test_refusals_are_endpoint_faults_with_status_excerpt_and_fix(status: int) -> None:
    body = {"object": "error", "message": f"refused by the gateway ({status})", "code": status}
    script = ScriptedServer(error_response(status, body))
    with pytest.raises(EndpointFaultError) as info:
        complete(script)
    e = info.value
    assert type(e) is EndpointFaultError and not isinstance(e, PermanentError)
    assert (e.status, e.endpoint, e.kind) == (status, script.url, "endpoint_fault")
    assert f"HTTP {status} from {script.url}" in str(e)
    assert e.excerpt == f"refused by the gateway ({status})"
    assert e.fix  # what to change, for the one line the router and the driver print


def test_the_key_statuses_say_which_setting_to_fix() -> None:
    with pytest.raises(EndpointFaultError) as unauthorized:
        complete(ScriptedServer(error_response(401, {"error": "Unauthorized"})))
    assert "api_key_env" in unauthorized.value.fix
    with pytest.raises(EndpointFaultError) as missing:
        complete(ScriptedServer(error_response(404)))
    assert "target.model" in missing.value.fix


def test_a_404_on_a_url_without_v1_hints_at_v1() -> None:
    script = ScriptedServer(error_response(404, {"detail": "Not Found"}))
    with script.running():
        client = make_client(script.base)  # http://127.0.0.1:P, no /v1

        async def go():
            try:
                return await client.complete(MESSAGES, None, sample_id="s")
            finally:
                await client.aclose()

        with pytest.raises(EndpointFaultError) as info:
            asyncio.run(go())
    assert f"try {script.base}/v1" in info.value.fix
    assert script.requests[0].path == "/chat/completions"


@pytest.mark.parametrize(
    "content_type", ["text/html; charset=utf-8", "text/event-stream", "application/json"]
)
def test_an_html_page_with_http_200_is_not_the_protocol(content_type: str) -> None:
    script = ScriptedServer(Reply(200, HTML, {"Content-Type": content_type}))
    with pytest.raises(NotProtocolError) as info:
        complete(script)
    e = info.value
    assert isinstance(e, EndpointFaultError) and e.endpoint == script.url
    assert f"Content-Type {content_type!r}" in str(e)
    assert e.excerpt.startswith("<!DOCTYPE html> <html><head><title>Access denied")
    assert "without finish_reason" not in str(e)


def test_json_without_choices_is_not_the_protocol() -> None:
    body = b'{"status": "ok", "service": "login"}'
    script = ScriptedServer(Reply(200, body, {"Content-Type": "application/json"}))
    with pytest.raises(NotProtocolError) as info:
        complete(script, sampling=Sampling(token_ids="nonstream"))
    assert '"service": "login"' in str(info.value)
    assert "application/json" in str(info.value)


def test_a_non_streamed_body_that_is_not_json_is_not_the_protocol() -> None:
    script = ScriptedServer(Reply(200, HTML, {"Content-Type": "text/html"}))
    with pytest.raises(NotProtocolError) as info:
        complete(script, sampling=Sampling(token_ids="nonstream"))
    assert "'text/html'" in str(info.value) and "Access denied" in str(info.value)


def test_an_event_stream_sent_with_another_content_type_still_reads() -> None:
    reply = stream_response(OK_CHUNKS)
    reply.headers["Content-Type"] = "application/json"  # some proxies relabel the stream
    assert complete(ScriptedServer(reply)).content == "Hello world"


def test_an_error_object_in_a_200_answer_to_a_stream_is_its_error() -> None:
    body = b'{"error": {"message": "bad request", "code": 400}}'
    with pytest.raises(PermanentError):
        complete(ScriptedServer(Reply(200, body, {"Content-Type": "application/json"})))
    refused = b'{"error": {"message": "forbidden", "code": 403}}'
    with pytest.raises(EndpointFaultError):
        complete(ScriptedServer(Reply(200, refused, {"Content-Type": "application/json"})))


def test_an_error_object_in_the_stream_with_a_refusal_status_is_an_endpoint_fault() -> None:
    events = [{"error": {"message": "token expired", "code": 401}}]
    with pytest.raises(EndpointFaultError) as info:
        complete(ScriptedServer(stream_response(events)))
    assert info.value.status == 401 and "token expired" in info.value.excerpt


# ---- text that is not valid Unicode --------------------------------------------------------


def _escaped(chunks: list[dict]) -> Reply:
    """The SSE body as a server that escapes non-ASCII writes it (json.dumps' default)."""
    return stream_response(chunks)


@pytest.mark.parametrize(
    ("chunks", "field"),
    [
        ([chunk(content="bad \ud800 text", finish="stop")], "content"),
        ([chunk(reasoning="think \udfff"), chunk(content="ok", finish="stop")], "reasoning"),
        (
            [
                chunk(
                    tool_calls=[
                        {
                            "index": 0,
                            "id": "functions.f:0",
                            "function": {"name": "f", "arguments": '{"a": "\ud83d"}'},
                        }
                    ],
                    finish="tool_calls",
                )
            ],
            "tool_calls[0].arguments",
        ),
    ],
)
def test_an_answer_with_a_lone_surrogate_fails_the_sample_naming_the_field(
    chunks: list[dict], field: str
) -> None:
    script = ScriptedServer(_escaped(chunks))
    with pytest.raises(InvalidTextError) as info:
        complete(script)
    e = info.value
    assert isinstance(e, PermanentError) and e.kind == "invalid_unicode"
    assert f"field {field!r}" in str(e) and "lone surrogate U+D" in str(e)
    str(e).encode("utf-8")  # the message itself is writable


def test_a_valid_surrogate_pair_is_one_character_and_passes() -> None:
    reply = _escaped([chunk(content="smile \ud83d\ude00", finish="stop")])
    assert complete(ScriptedServer(reply)).content == "smile \U0001f600"


def test_every_request_error_message_is_writable() -> None:
    e = RequestError("server said \ud800 here", status=400)
    assert "\ufffd" in str(e)
    str(e).encode("utf-8")


def test_a_first_piece_cut_mid_line_decides_nothing() -> None:
    from regen.client.transport import _not_sse

    assert not _not_sse(b"da")  # "data: ..." cut after two bytes: wait for the line's end
    assert not _not_sse(b"\n\ndata: {")
    assert not _not_sse(b": keep-alive\n")
    assert _not_sse(b"<html>\n")
    assert _not_sse(b"<html>", whole=True) and not _not_sse(b"data: {}", whole=True)
