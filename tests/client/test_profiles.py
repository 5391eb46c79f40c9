"""Engine profiles without a real engine: recognition at the endpoint check and each profile's
exact-ids path against the simulator speaking SGLang and vLLM (tests/engines holds the vLLM
dialect against a real vLLM, tests/contract the SGLang one against the wheel)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import NamedTuple

import httpx2
import pytest

from regen.client import ChatClient, check_endpoint
from regen.client.endpoints import engine_records
from regen.client.profiles import OPENAI, PROFILES, SGLANG, VLLM, profile_named
from regen.core.errors import PermanentError
from regen.devkit.simulate.testing import running_simulator
from regen.manifest import Endpoint, Sampling

TOKENIZER = Path(__file__).resolve().parents[2] / "manifests" / "demo" / "tokenizer"
MSGS = [{"role": "user", "content": "hello there"}]


class Sim(NamedTuple):
    url: str
    engine: str


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def sim(request):
    with running_simulator(engine=request.param, tokenizer=str(TOKENIZER), instant=True,
                           model_name="demo-target") as s:  # fmt: skip
        yield Sim(s.url, request.param)


async def _check(url: str):
    async with httpx2.AsyncClient(timeout=10) as http:
        return await check_endpoint(Endpoint(url=url), "demo-target", http=http)


async def _once(c: ChatClient):
    try:
        return await c.complete_once(MSGS, None, sample_id="t")
    finally:
        await c.aclose()


def test_the_endpoint_check_names_the_engine(sim) -> None:
    info = asyncio.run(_check(sim.url))
    assert info.engine == sim.engine
    assert info.server_info is (sim.engine == "sglang")
    rec = engine_records([info], Sampling(), "sess")[sim.url]
    want = {"sglang": "sglext", "vllm": "vllm_stream"}[sim.engine]
    assert (rec["engine"], rec["token_path"], rec["session"]) == (sim.engine, want, "sess")
    rec = engine_records([info], Sampling(token_ids="nonstream"), "s")[sim.url]
    assert rec["token_path"] == {"sglang": "sglang_nonstream", "vllm": "vllm_nonstream"}[sim.engine]
    assert (
        engine_records([info], Sampling(token_ids="local"), "s")[sim.url]["token_path"] == "local"
    )


@pytest.mark.parametrize("mode", ["stream", "nonstream"])
def test_each_profile_gets_its_engines_ids(sim, mode) -> None:
    def once(engine: str):
        c = ChatClient(Endpoint(url=sim.url), model="demo-target", engine=engine,
                       sampling=Sampling(max_tokens=12, seed=3, token_ids=mode))  # fmt: skip
        return asyncio.run(_once(c))

    right = once(sim.engine)
    assert right.prompt_token_ids and right.output_token_ids
    assert len(right.output_token_ids) == right.completion_tokens
    assert right.engine == sim.engine and right.reasoning  # its own reasoning field is read
    other = "vllm" if sim.engine == "sglang" else "sglang"
    if sim.engine == "sglang" and mode == "stream":
        # vLLM's return_token_ids with stream: SGLang refuses it (HTTP 400), loudly
        with pytest.raises(PermanentError) as e:
            once(other)
        assert e.value.status == 400
        return
    wrong = once(other)  # the other engine's fields: never both ids, so the row is local
    assert wrong.prompt_token_ids is None or wrong.output_token_ids is None
    assert (right.content, right.reasoning) == (wrong.content, wrong.reasoning)


def test_profiles_by_name() -> None:
    assert profile_named(None) is SGLANG and profile_named("vllm") is VLLM
    assert set(PROFILES) == {"sglang", "vllm", "openai"}
    assert OPENAI.ids_fields(True) == {} and not OPENAI.gives_ids
    with pytest.raises(ValueError, match="unknown engine"):
        profile_named("tgi")
