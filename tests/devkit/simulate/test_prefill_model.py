"""The discrete-event model of benchmarks/prefill.py is the simulator's: the same chunked
prefill and step time as the asyncio scheduler, the same prefix cache; and its routing does
what it says (a conversation's turns on one endpoint find their history cached)."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.prefill_model import Conversation, ServerParams, Turn, after_segments, run
from regen.devkit.simulate.scheduler import Job, Scheduler

STEP, PREFILL, CHUNK = 0.002, 1e-5, 4096


def _turn(prompt: tuple, completion: int, nxt: tuple | None, key: str) -> Turn:
    return Turn(prompt, sum(t for _, t in prompt), completion,
                after_segments(prompt, nxt, key, completion))  # fmt: skip


def test_one_request_costs_what_the_scheduler_says():
    params = ServerParams(slots=4, step_s=STEP, prefill_s_per_token=PREFILL, chunk=CHUNK)
    prompt = (("a", 10_000), (("gen",), 3))
    conv = Conversation("s", (_turn(prompt, 5, None, "x"),))
    model = run([conv], [0], endpoints=1, params=params)

    async def scheduler() -> Scheduler:
        sched = Scheduler(4, STEP, 1, prefill_s_per_token=PREFILL, chunk=CHUNK)
        sched.start()
        job = sched.submit(Job(total=5, prompt=10_003, prefill=10_003))
        try:
            for _ in range(2000):  # bounded: a few ms a step
                if job.done:
                    break
                await asyncio.sleep(0.002)
        finally:
            await sched.stop()
        return sched

    c = asyncio.run(scheduler()).counters
    # three chunks (4096, 4096, 1811; the prefill's token in the third), then 4 decode steps
    expected = 7 * STEP + 10_003 * PREFILL
    assert model.busy_s == pytest.approx(expected)
    # the scheduler: the same prefill time; its steps are 7 unless a busy machine made it
    # run some late (catch-up steps count whole, so no wall-clock-free equality there)
    assert (c.prefill_tokens, model.prefill_s) == (10_003, pytest.approx(c.prefill_s))
    assert c.busy_s == pytest.approx(c.steps * STEP + c.prefill_s)
    assert c.steps >= 7 and (c.late_steps or c.steps == 7)
    assert (model.prompt, model.cached, model.completion) == (10_003, 0, 5)


def _conversations(n: int, turns: int) -> list[Conversation]:
    out = []
    for c in range(n):
        prompts = []
        history: tuple = ((f"sys{c}", 500),)
        for t in range(turns):
            history = (*history, (f"u{c}.{t}", 200))
            prompts.append((*history, (("gen",), 3)))
            history = (*history, (f"a{c}.{t}", 100))
        turns_ = tuple(
            _turn(p, 100, prompts[t + 1] if t + 1 < turns else None, f"end{c}")
            for t, p in enumerate(prompts)
        )
        out.append(Conversation("s", turns_))
    return out


def test_affinity_keeps_the_history_cached():
    convs = _conversations(40, 4)
    params = ServerParams(slots=4, step_s=STEP, prefill_s_per_token=PREFILL, chunk=CHUNK)
    on = run(convs, list(range(40)), endpoints=4, affinity="affinity", params=params)
    off = run(convs, list(range(40)), endpoints=4, affinity="random", params=params, seed=1)
    # with affinity every later turn finds all but its new user message: turn t (t >= 1)
    # of a conversation caches 500 + t * 300 - 1... of 500 + 200 + t * 300 + 3 tokens
    prompt = sum(t.prompt for c in convs for t in c.turns)
    assert on.prompt == off.prompt == prompt
    assert on.cached == 40 * sum(500 + t * 300 for t in range(1, 4))
    assert off.cached < on.cached
    assert off.prefill_s > on.prefill_s
    assert on.completion == off.completion == 40 * 4 * 100


def test_queued_next_turns_wait_behind_new_samples():
    convs = _conversations(20, 3)
    params = ServerParams(slots=2, step_s=STEP, prefill_s_per_token=PREFILL, chunk=CHUNK,
                          cache_tokens=3000)  # fmt: skip
    at_once = run(convs, list(range(20)), endpoints=1, params=params)
    queued = run(convs, list(range(20)), endpoints=1, next_turn="queued", params=params)
    assert queued.cached < at_once.cached  # the small cache evicted the history meanwhile
