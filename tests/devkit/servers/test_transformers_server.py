"""The demo target and a real `transformers serve` of it, driven through ChatClient and the router.

One module-scoped server; every request is small (max_tokens <= 96) to keep the module quick.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx2
import pytest

from regen.client import ChatClient, RetryPolicy, check_endpoints
from regen.core.errors import ConfigError, EndpointError, PermanentError
from regen.devkit.demo_target import CONTENT, MARKER, OLD_MARKERS, REASONING, DemoTargetSpec
from regen.devkit.procs import group_alive
from regen.devkit.servers import TransformersServer, build_demo_target
from regen.engine.router import EndpointRouter
from regen.manifest import Endpoint, Sampling

# the module's first test of a fresh checkout builds the demo target (demo_target: about two
# CPU minutes, several more with both cores busy); every request after it is small
pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[3]
TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"
DEMO = REPO / "manifests" / "demo.yaml"
MSGS = [{"role": "user", "content": "Tell me about the tiny model."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def model_dir(demo_target) -> Path:
    return demo_target


@pytest.fixture(scope="module")
def server(demo_server):
    """The demo target's server, shared with other modules (tests/conftest.py)."""
    return demo_server


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def prompt_len(tokenizer, messages, tools=None, **kw) -> int:
    ids = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False, **kw
    )
    return len(ids["input_ids"] if isinstance(ids, dict) else ids)


def client(server, *, engine: str = "openai", **sampling) -> ChatClient:
    """A client for the server. SampleWorker asks for ids only where the start check
    recognised an engine that gives them, which transformers serve is not (checked below).
    ``thinking`` is sent as Kimi's switch, as a run sends it (Manifest.template_kwargs)."""
    switch = {"thinking": sampling["thinking"]} if "thinking" in sampling else {}
    return ChatClient(
        Endpoint(url=server.url),
        model=server.model_name,
        sampling=Sampling(**{"max_tokens": 8, **sampling}),
        retry=RetryPolicy(max_attempts=1),
        timeout_s=60,
        engine=engine,
        template_kwargs=switch,
    )


async def _complete(c: ChatClient, messages, tools=None):
    try:
        return await c.complete(messages, tools, sample_id="t")
    finally:
        await c.aclose()


def test_demo_target_shape_sharding_and_cache(model_dir, tmp_path):
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] >= 4  # three distinct capture layers exist
    assert config["head_dim"] >= 32  # real engines' CPU attention kernels
    assert config["hidden_size"] == config["num_attention_heads"] * config["head_dim"]
    assert config["vocab_size"] == 1024 and config["tie_word_embeddings"] is False
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= set(index["weight_map"])
    assert len(set(index["weight_map"].values())) > 1  # sharded, like a real checkpoint
    copied = (model_dir / "tokenizer.json").read_bytes()
    assert copied == (TOKENIZER / "tokenizer.json").read_bytes()
    marker = json.loads((model_dir / MARKER).read_text())
    assert marker["final_loss"] < marker["first_loss"] / 10 and marker["tool_turns"] > 0
    before = (model_dir / MARKER).stat().st_mtime_ns
    assert build_demo_target(model_dir, DEMO) == model_dir  # cached: returns at once
    assert (model_dir / MARKER).stat().st_mtime_ns == before
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a demo-target build"):
        build_demo_target(foreign, DEMO)
    assert (foreign / "precious.txt").read_text() == "keep me"


def test_demo_target_build_is_deterministic_and_replaces_the_old_tiny_model(tmp_path):
    spec = DemoTargetSpec(steps=3)  # the same code path, a few steps
    old = tmp_path / "a"  # what `regen demo` of earlier versions left in .cache/demo-model
    old.mkdir()
    (old / OLD_MARKERS[0]).write_text("{}")
    (old / "model.safetensors").write_bytes(b"random weights")
    a = build_demo_target(old, DEMO, spec)
    assert not (a / "model.safetensors").exists()
    b = build_demo_target(tmp_path / "b", DEMO, spec)
    shards = sorted(p.name for p in a.glob("*.safetensors"))
    assert shards and shards == sorted(p.name for p in b.glob("*.safetensors"))
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in shards)


def test_the_demo_target_thinks_closes_and_ends_its_turn(server):
    r = asyncio.run(_complete(client(server, max_tokens=64, thinking=True), MSGS))
    assert r.finish_reason == "stop"  # ended with <|im_end|>, not cut by max_tokens
    assert r.reasoning == REASONING and r.content == CONTENT  # </think> closed the reasoning


def test_the_demo_target_calls_the_offered_tool_in_kimi_format(server):
    """A demo prompt with its tools: transformers serve parses the Kimi tool-call section."""
    from regen.manifest import load_manifest
    from regen.sources import source_set
    from regen.sources.stream import read_samples

    sample = next(s for s in read_samples(source_set(load_manifest(DEMO))) if s.id == "xlam:1")
    msgs = [m.to_openai() for m in sample.messages if m.role != "assistant"]
    r = asyncio.run(_complete(client(server, max_tokens=96, temperature=0.0), msgs, sample.tools))
    assert r.finish_reason == "tool_calls" and r.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in r.tool_calls] == [
        ("get_weather", {"city": "Lisbon"})
    ]


def test_models_endpoint_and_start_check(server, model_dir):
    assert server.url.endswith("/v1") and server.url.startswith("http://127.0.0.1:")
    assert server.model_name == str(model_dir)
    (info,) = asyncio.run(check_endpoints([Endpoint(url=server.url)], server.model_name))
    assert info.models == (str(model_dir),)
    assert info.server_info is False and info.max_running_requests is None
    assert info.engine == "openai"  # neither /server_info nor vLLM's /version + metrics
    with pytest.raises(EndpointError, match="it serves"):
        asyncio.run(check_endpoints([Endpoint(url=server.url)], "moonshotai/Kimi-K2.5"))


def test_streamed_usage_matches_the_servers_counts(server, tokenizer):
    r = asyncio.run(_complete(client(server, max_tokens=12, thinking=True), MSGS))
    assert r.prompt_tokens == prompt_len(tokenizer, MSGS, thinking=True)
    assert r.finish_reason in ("stop", "length")
    if r.finish_reason == "length":
        assert r.completion_tokens == 12
    else:
        assert 1 <= r.completion_tokens <= 12
    assert r.model == server.model_name and r.endpoint == server.url
    assert r.latency_s > 0 and (r.ttft_s is None or 0 < r.ttft_s <= r.latency_s)


def test_chat_template_kwargs_are_honoured(server, tokenizer):
    async def both():
        on = await _complete(client(server, max_tokens=1, thinking=True), MSGS)
        off = await _complete(client(server, max_tokens=1, thinking=False), MSGS)
        return on, off

    on, off = asyncio.run(both())
    assert on.prompt_tokens == prompt_len(tokenizer, MSGS, thinking=True)
    assert off.prompt_tokens == prompt_len(tokenizer, MSGS, thinking=False)
    assert off.prompt_tokens != on.prompt_tokens  # <think></think> vs <think>


def test_tools_are_rendered_by_the_template(server, tokenizer):
    r = asyncio.run(_complete(client(server, max_tokens=2), MSGS, TOOLS))
    assert r.prompt_tokens == prompt_len(tokenizer, MSGS, TOOLS, thinking=True)


def test_concurrent_requests_through_the_router(server):
    infos = asyncio.run(check_endpoints([Endpoint(url=server.url)], server.model_name))
    router = EndpointRouter(infos)
    router.set_limit(server.url, 3)
    c = client(server, max_tokens=4)

    async def one(i: int):
        async with router.lease(f"s{i}"):
            msgs = [{"role": "user", "content": f"q {i}"}]
            return await c.complete(msgs, None, sample_id=f"s{i}")

    async def all_():
        try:
            return await asyncio.gather(*(one(i) for i in range(6)))
        finally:
            await c.aclose()

    results = asyncio.run(all_())
    assert all(r.completion_tokens and r.completion_tokens <= 4 for r in results)
    snap = router.snapshot()[server.url]
    assert (snap["requests"], snap["ok"], snap["in_flight"], snap["state"]) == (6, 6, 0, "up")


def test_fields_outside_its_schema_are_permanent_errors(server):
    with pytest.raises(PermanentError) as info:
        # SGLang's id fields forced on a server that does not know them
        asyncio.run(_complete(client(server, engine="sglang", token_ids="nonstream"), MSGS))
    assert info.value.status == 422
    wrong = ChatClient(
        Endpoint(url=server.url),
        model="not-this-model",
        sampling=Sampling(max_tokens=2),
        engine="openai",
    )
    with pytest.raises(PermanentError) as info:
        asyncio.run(_complete(wrong, MSGS))
    assert info.value.status == 400


def test_stop_ends_the_process_group(model_dir):
    srv = TransformersServer(model_dir, startup_timeout_s=120).start()
    pid, url = srv.pid, srv.root
    assert pid is not None and httpx2.get(f"{url}/health").status_code == 200
    srv.stop()
    assert not group_alive(pid)  # no live process of its group once stop() returns
    with pytest.raises(httpx2.ConnectError):
        httpx2.get(f"{url}/health", timeout=2)
