"""vLLM's profile held against a real vLLM 0.32 server: what it says of itself, the exact ids
streamed and not, reasoning and tool calls through its Kimi parsers, and its error shapes.

Each exchange is recorded from the server in the test (raw SSE lines, JSON bodies) and read
both by hand, here, and by regen's client with the vLLM profile: the two must agree.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from _models import TOOL_ARGS, TOOL_NAME

from regen.client import ChatClient, check_endpoint
from regen.client.profiles import SGLANG, VLLM
from regen.client.stream import StreamAccumulator
from regen.core.errors import OverloadedError, PermanentError
from regen.manifest import Endpoint, Sampling
from regen.targets.kimi import KIMI

pytestmark = pytest.mark.vllm

MSGS = [{"role": "user", "content": "tell me about q"}]
#: a prompt of 4,320 characters: vLLM renders it after the preflight and before the engine takes
#: the request, a window in which the other streams of a burst pass the preflight too (with
#: MSGS alone, quiet runs saw only plain 503s in 10 bursts out of 10)
LONG = [{"role": "user", "content": "tell me about q and its many parts, " * 120}]
TOOLS = [{"type": "function", "function": {"name": TOOL_NAME, "description": "look q up",
          "parameters": {"type": "object", "properties": {"q": {"type": "integer"}}}}}]  # fmt: skip


def raw(server, body: dict[str, Any]) -> tuple[int, str]:
    with httpx2.Client(timeout=120) as http:
        r = http.post(f"{server.url}/chat/completions", json=body)
        return r.status_code, r.text


def data_lines(text: str) -> list[Any]:
    out = []
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            out.append(json.loads(line[5:]))
    return out


def body(stream: bool, **extra: Any) -> dict[str, Any]:
    b = {"model": "demo-target", "messages": MSGS, "max_completion_tokens": 24,
         "temperature": 0.6, "seed": 11, "return_token_ids": True,
         "chat_template_kwargs": {"thinking": True}, **extra}  # fmt: skip
    if stream:
        b |= {"stream": True, "stream_options": {"include_usage": True}}
    return b


def client(server, engine=VLLM, **sampling: Any) -> ChatClient:
    """A client as a manifest of the Kimi demo target builds it (its family's thinking switch)."""
    s = Sampling(**{"max_tokens": 24, "seed": 11, "temperature": 0.6, **sampling})
    return ChatClient(Endpoint(url=server.url), model="demo-target", sampling=s, engine=engine,
                      template_kwargs=KIMI.template_kwargs(s.thinking))  # fmt: skip


def run(coro):
    return asyncio.run(coro)


async def _once(c: ChatClient, msgs, tools=None):
    try:
        return await c.complete_once(msgs, tools, sample_id="t")
    finally:
        await c.aclose()


def test_the_endpoint_check_recognises_vllm(vllm_server) -> None:
    async def check():
        async with httpx2.AsyncClient(timeout=10) as http:
            return await check_endpoint(Endpoint(url=vllm_server.url), "demo-target", http=http)

    info = run(check())
    assert (info.engine, info.version, info.server_info) == ("vllm", "0.32.0", False)
    assert info.max_model_len == 2048 and info.max_running_requests is None
    assert info.speculative == {}  # a plain server: no vllm:spec_decode_* counters
    with httpx2.Client(timeout=10) as http:  # the facts the profile rests on
        assert http.get(f"{vllm_server.root}/server_info").status_code == 404
        assert http.get(f"{vllm_server.root}/version").json() == {"version": "0.32.0"}


def test_streamed_and_whole_ids_are_the_same_answer(vllm_server) -> None:
    status, whole_text = raw(vllm_server, body(False))
    assert status == 200
    whole = json.loads(whole_text)
    status, stream_text = raw(vllm_server, body(True))
    assert status == 200
    chunks = data_lines(stream_text)
    # by hand: the prompt ids at the top level of the first chunk only, then a token_ids list
    # on the choice of every later chunk (empty deltas included), the finish chunk too
    assert "prompt_token_ids" in chunks[0] and chunks[0]["choices"][0]["delta"]["role"]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    with_choice = [c for c in chunks[1:] if c["choices"]]
    assert all(isinstance(c["choices"][0].get("token_ids"), list) for c in with_choice)
    streamed = [i for c in with_choice for i in c["choices"][0]["token_ids"]]
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert streamed == whole["choices"][0]["token_ids"]  # the same seed, the same answer
    assert len(streamed) == whole["usage"]["completion_tokens"]
    # the reasoning field is `reasoning`, never SGLang's `reasoning_content`
    assert "reasoning" in whole["choices"][0]["message"]
    assert "reasoning_content" not in whole["choices"][0]["message"]
    # regen's accumulator and profile read the same ids out of the same lines
    acc = StreamAccumulator()
    for line in stream_text.splitlines():
        acc.feed_bytes(line.encode())
    assert VLLM.stream_ids(acc) == (whole["prompt_token_ids"], streamed)
    assert SGLANG.stream_ids(acc) == (None, None)  # nothing where SGLang puts them


def test_the_client_gets_vllms_ids_both_ways(vllm_server) -> None:
    for mode in ("stream", "nonstream"):
        res = run(_once(client(vllm_server, token_ids=mode), MSGS))
        assert res.engine == "vllm" and res.prompt_token_ids and res.output_token_ids
        assert len(res.output_token_ids) == res.completion_tokens
        assert res.reasoning  # thinking on: the scripted target's text is all reasoning
        assert (res.ttft_s is None) == (mode == "nonstream")
    a = run(_once(client(vllm_server, token_ids="stream"), MSGS))
    b = run(_once(client(vllm_server, token_ids="nonstream"), MSGS))
    assert (a.prompt_token_ids, a.output_token_ids) == (b.prompt_token_ids, b.output_token_ids)


def test_asking_the_sglang_way_gets_no_ids_and_no_error(vllm_server) -> None:
    """vLLM drops unknown request fields silently: SGLang's profile on vLLM gets no ids."""
    res = run(_once(client(vllm_server, engine=SGLANG, token_ids="stream"), MSGS))
    assert res.prompt_token_ids is None and res.output_token_ids is None
    assert res.content or res.reasoning


def test_tool_calls_through_vllms_kimi_parser(vllm_server) -> None:
    for mode in ("stream", "nonstream"):
        res = run(_once(client(vllm_server, token_ids=mode, thinking=False), MSGS, TOOLS))
        assert res.finish_reason == "tool_calls"
        assert [(c.id, c.name, json.loads(c.arguments)) for c in res.tool_calls] == [
            ("functions.lookup:0", TOOL_NAME, json.loads(TOOL_ARGS))
        ]
        # the ids are the model's tokens: the whole tool section and <|im_end|>
        text = json.loads(raw(vllm_server, {"model": "demo-target", "messages": MSGS,
                                            "tools": TOOLS, "max_completion_tokens": 24,
                                            "chat_template_kwargs": {"thinking": False},
                                            "return_token_ids": True})[1])  # fmt: skip
        assert res.output_token_ids == text["choices"][0]["token_ids"]


def test_error_shapes(vllm_server) -> None:
    long = [{"role": "user", "content": "hello " * 2100}]
    status, text = raw(vllm_server, {"model": "demo-target", "messages": long})
    err = json.loads(text)["error"]
    assert status == 400 and err["param"] == "input_tokens" and err["code"] == 400
    status, text = raw(vllm_server, {**body(True), "messages": long})
    assert status == 400  # refused before any stream starts
    with pytest.raises(PermanentError) as e:
        run(_once(client(vllm_server), long))
    assert e.value.status == 400
    status, text = raw(vllm_server, {**body(False), "model": "nope"})
    assert status == 404 and json.loads(text)["error"]["code"] == 404


def test_both_overload_shapes_are_overload(vllm_spec_server) -> None:
    """--max-num-queued-reqs: a request past the limit gets a plain 503 when refused before
    its response starts (vLLM's preflight), and HTTP 200 with an error event when several
    pass the preflight at once and the engine refuses them; regen reads both as overload."""
    import concurrent.futures

    def one(stream: bool) -> tuple[int, str]:
        if stream:
            return raw(vllm_spec_server, body(stream, max_completion_tokens=64, messages=LONG))
        return raw(vllm_spec_server, body(stream, max_completion_tokens=64))

    seen: dict[str, tuple[int, str]] = {}
    streams = [True] * 8 + [False] * 4
    for burst in range(10):  # bursts, until both shapes were seen (bounded)
        with concurrent.futures.ThreadPoolExecutor(12) as ex:
            # 8 streams at once (several pass the preflight together: the engine refuses
            # them, an error event), then the 4 others a moment later, when odd bursts find
            # the queue already full (the preflight refuses them: a plain 503)
            futures = [ex.submit(one, True) for _ in range(8)]
            time.sleep(0.3 * (burst % 2))
            futures += [ex.submit(one, False) for _ in range(4)]
            got = [f.result() for f in futures]
        for (status, text), stream in zip(got, streams, strict=True):
            if status == 503:
                seen.setdefault("plain", (status, text))
            elif stream and '"error"' in text:
                seen.setdefault("event", (status, text))
        if len(seen) == 2:
            break
    assert set(seen) == {"plain", "event"}, seen.keys()
    status, text = seen["plain"]
    from regen.client.errors import body_message, status_error

    parsed = json.loads(text)
    assert parsed["error"]["code"] == 503
    assert isinstance(status_error(status, body_message(parsed, ""), endpoint="e"),
                      OverloadedError)  # fmt: skip
    status, text = seen["event"]
    assert status == 200
    acc = StreamAccumulator()
    with pytest.raises(OverloadedError):
        for line in text.splitlines():
            acc.feed_bytes(line.encode())


# ---- the simulator's vLLM dialect, held against the same exchanges ----------------------------


def shape(value: Any) -> Any:
    """The keys of a JSON value, recursively (lists by their first element): its shape."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__ if value is not None else None


def keys(value: Any) -> set[str]:
    return set(value) if isinstance(value, dict) else set()


@pytest.fixture(scope="module")
def vllm_sim():
    from regen.devkit.simulate.testing import running_simulator

    tok = Path(__file__).resolve().parents[2] / "manifests" / "demo" / "tokenizer"
    with running_simulator(engine="vllm", tokenizer=str(tok), model_name="demo-target",
                           context_length=2048, instant=True) as sim:  # fmt: skip
        yield sim


def test_the_simulator_speaks_vllm_as_the_server_does(vllm_server, vllm_sim) -> None:
    sim = type("S", (), {"url": vllm_sim.url, "root": vllm_sim.base})()
    with httpx2.Client(timeout=30) as http:
        for root in (vllm_server.root, sim.root):
            assert http.get(f"{root}/server_info").status_code == 404
            assert keys(http.get(f"{root}/version").json()) == {"version"}
            assert "vllm:" in http.get(f"{root}/metrics").text
            assert http.get(f"{root}/v1/models").json()["data"][0]["owned_by"] == "vllm"
    real_whole, sim_whole = (json.loads(raw(s, body(False))[1]) for s in (vllm_server, sim))
    for got in (real_whole, sim_whole):
        assert "prompt_token_ids" in got and "token_ids" in got["choices"][0]
        msg = got["choices"][0]["message"]
        assert "reasoning" in msg and "reasoning_content" not in msg
        assert "response_token_ids" not in got["choices"][0] and "sglext" not in got
    real_chunks, sim_chunks = (data_lines(raw(s, body(True))[1]) for s in (vllm_server, sim))
    for chunks in (real_chunks, sim_chunks):
        assert "prompt_token_ids" in chunks[0] and chunks[0]["choices"][0]["delta"]["role"]
        later = [c for c in chunks[1:] if c["choices"]]
        assert all(isinstance(c["choices"][0].get("token_ids"), list) for c in later)
        assert {k for c in later for k in c["choices"][0]["delta"]} <= {"reasoning", "content",
                                                                        "tool_calls"}  # fmt: skip
        ids = [i for c in later for i in c["choices"][0]["token_ids"]]
        assert len(ids) == chunks[-1]["usage"]["completion_tokens"]
    # regen's client reads both the same way
    for server in (vllm_server, sim):
        res = run(_once(client(server, token_ids="stream"), MSGS))
        assert res.prompt_token_ids and len(res.output_token_ids) == res.completion_tokens


def test_the_simulators_vllm_errors_have_the_servers_shape(vllm_server, vllm_sim) -> None:
    sim = type("S", (), {"url": vllm_sim.url, "root": vllm_sim.base})()
    long = {"model": "demo-target", "messages": [{"role": "user", "content": "hello " * 2100}]}
    bad = {**body(False), "model": "nope"}
    for req, status in ((long, 400), (bad, 404)):
        got = [raw(s, req) for s in (vllm_server, sim)]
        assert [g[0] for g in got] == [status, status]
        real, simulated = (json.loads(g[1]) for g in got)
        assert shape(real) == shape(simulated)
        assert real["error"]["param"] == simulated["error"]["param"]
    from regen.devkit.simulate.testing import running_simulator

    with running_simulator(engine="vllm", model_name="demo-target", instant=True,
                           fault_sequence="503") as over:  # fmt: skip
        o = type("S", (), {"url": over.url, "root": over.base})()
        status, text = raw(o, {**body(False), "return_token_ids": False})
        assert status == 503
        assert json.loads(text)["error"]["message"].startswith("The engine is currently busy")
        other = [{"role": "user", "content": "another question"}]
        status, text = raw(o, {**body(True), "return_token_ids": False, "messages": other})
        assert status == 200 and data_lines(text)[0]["error"]["code"] == 503
