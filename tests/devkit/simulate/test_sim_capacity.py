"""The capacity model: R slots x K tokens per step; a full batch reaches R*K/step, an
under-filled one wastes the empty slots. Measured from the server's own /stats."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from regen.devkit.simulate.testing import RunningSimulator, running_simulator
from tests._loadgen import run_load

pytestmark = pytest.mark.timeout(60)

R, K, STEP_MS, LENGTH = 16, 4, 4.0, 200
CAPACITY = R * K / (STEP_MS / 1000)  # 16,000 tok/s


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningSimulator]:
    with running_simulator(
        max_running_requests=R,
        tokens_per_step=K,
        step_ms=STEP_MS,
        mean_tokens=LENGTH,
        length_sigma=0,
    ) as s:
        yield s


def load(sim: RunningSimulator, requests: int, concurrency: int, first: int) -> dict:
    sim.reset_stats()
    res = asyncio.run(run_load(sim.url, requests=requests, concurrency=concurrency, first=first))
    assert res.failed == 0 and res.requests == requests
    st = sim.stats()
    assert st["completed"] == requests and st["tokens_generated"] == requests * LENGTH
    assert st["capacity_tok_s"] == CAPACITY
    return st


def test_full_batch_reaches_capacity(sim):
    st = load(sim, requests=80, concurrency=2 * R, first=0)  # a queue exists all along
    rate = st["tokens_generated"] / st["window_s"]
    assert 0.85 * CAPACITY <= rate <= 1.02 * CAPACITY
    assert 0.85 <= st["utilization"] <= 1.02
    assert st["mean_batch_occupancy"] >= 0.9


def test_underfilled_batch_wastes_capacity(sim):
    st = load(sim, requests=12, concurrency=R // 4, first=1000)
    rate = st["tokens_generated"] / st["window_s"]
    assert 0.18 <= st["mean_batch_occupancy"] <= 0.26  # 4 of 16 slots busy
    assert rate <= 0.27 * CAPACITY  # the empty slots are lost, not given to others
    assert rate >= 0.15 * CAPACITY


def test_instant_mode_answers_at_once():
    with running_simulator(instant=True, mean_tokens=400, length_sigma=0) as s:
        res = asyncio.run(run_load(s.url, requests=8, concurrency=8))
        st = s.stats()
    assert res.failed == 0 and st["tokens_generated"] == 8 * 400
    # no step of the capacity model ran (it would take 400 steps of 3.2 ms): counted, not timed
    assert (st["steps"], st["busy_s"]) == (0, 0.0)
