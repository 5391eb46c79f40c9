"""Tail-aware dispatch order: cost from turns, learned per-source lengths and prompt size;
re-keyed as estimates move; learned state derived from the parts on resume."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pyarrow as pa
import pytest

from regen.core.sample import Message, Sample, ToolCall
from regen.engine.schedule import (
    DEFAULT_TOKENS_PER_TURN,
    PRIOR_SLOPE,
    REBUILD_DUTY,
    REPRIORITISE_EVERY_S,
    LengthModel,
    WorkQueue,
)
from regen.plan.packed import PackedSample, Spill, unpacked
from regen.store import RunDir
from regen.store.completed import CompletedSample
from regen.store.doneset import read_done
from regen.store.segments import Journal


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def sample(sid: str, source: str, turns: int, prompt: str = "q") -> Sample:
    msgs: list[Message] = []
    for i in range(turns):
        msgs += [Message("user", f"{prompt} {i}"), Message("assistant", "a")]
    return Sample(f"{source}:{sid}", source, msgs)


def drain(q: WorkQueue) -> list[str]:
    out = []
    while (s := q.pop()) is not None:
        out.append(s.id)
    return out


def test_more_turns_first_then_longer_prompts_then_input_order() -> None:
    q = WorkQueue([sample("a", "x", 1), sample("b", "x", 3), sample("c", "x", 1, "long " * 400),
                   sample("d", "x", 2), sample("e", "x", 1)])  # fmt: skip
    assert drain(q) == ["x:b", "x:d", "x:c", "x:a", "x:e"]


def test_sources_that_ran_long_go_first_once_learned() -> None:
    clock = Clock()
    samples = [sample(str(i), src, 1) for i in range(3) for src in ("short", "long")]
    q = WorkQueue(samples, clock=clock)
    assert q.pop().source == "short"  # type: ignore[union-attr]  # unknown: input order
    clock.t += REPRIORITISE_EVERY_S
    q.observe("long", [2000, 1800])
    q.observe("short", [40])
    assert q.rebuilds == 1
    assert [s.split(":")[0] for s in drain(q)] == ["long"] * 3 + ["short"] * 2


def test_no_rebuild_before_the_interval_or_without_a_shift() -> None:
    clock = Clock()
    q = WorkQueue([sample("a", "x", 1), sample("b", "y", 1)], clock=clock)
    q.observe("y", [5000])
    assert q.rebuilds == 0  # too soon
    clock.t += REPRIORITISE_EVERY_S
    assert q.maybe_reprioritise() and q.pop().id == "y:b"  # type: ignore[union-attr]
    clock.t += REPRIORITISE_EVERY_S
    assert not q.maybe_reprioritise()  # nothing moved since


def test_estimate_shrinks_towards_the_prior() -> None:
    m = LengthModel()
    assert m.tokens_per_turn("x") == DEFAULT_TOKENS_PER_TURN
    m.observe("x", [100] * 8)
    assert m.tokens_per_turn("x") < DEFAULT_TOKENS_PER_TURN
    assert 100 < m.tokens_per_turn("x") < m.global_mean() + 1
    m.observe("x", [100] * 1000)
    assert abs(m.tokens_per_turn("x") - 100) < 5


def test_requeued_sample_keeps_its_cost() -> None:
    q = WorkQueue([sample("a", "x", 1), sample("b", "x", 3)])
    b = q.pop()
    assert b is not None and b.id == "x:b"
    q.push(b)
    assert q.pop() is b


def test_learned_state_survives_a_resume_through_the_parts(tmp_path) -> None:
    rd = RunDir.open(tmp_path / "run")
    j = Journal(rd, "s1", to_table=pa.Table.from_pylist)  # only the columns read_done reads
    rows = [{"sample_id": "long:1", "source": "long", "turn": t, "completion_tokens": 1500,
             "prompt_tokens": 10, "finish_reason": "stop"} for t in range(2)]  # fmt: skip
    j.append(CompletedSample("long:1", "long", rows))
    j.append(CompletedSample("short:1", "short", [{**rows[0], "sample_id": "short:1",
                                                   "source": "short",
                                                   "completion_tokens": 30}]))  # fmt: skip
    j.append(
        CompletedSample(
            "nat:1",
            "nat",
            [{**rows[0], "sample_id": "nat:1", "source": "nat", "completion_tokens": 9999}],
        )
    )
    j.close()
    model = LengthModel.from_done(read_done(rd), ["long", "short"])
    assert set(model.sources) == {"long", "short"}  # native rows teach nothing
    assert model.sources["long"].turns == 2 and model.sources["long"].tokens == 3000
    q = WorkQueue([sample("2", "short", 1), sample("2", "long", 1)], model)
    assert q.pop().source == "long"  # type: ignore[union-attr]


def test_packed_sample_round_trip_and_cost() -> None:
    s = Sample("x:1", "x", [Message("user", "long " * 400), Message("assistant", "a")] * 2,
               tools=[{"type": "function", "function": {"name": "f"}}])  # fmt: skip
    p = PackedSample.pack(s)
    assert p.unpack() == s and p.unpack().content_hash == s.content_hash
    m = LengthModel()
    assert m.cost(p) == m.cost(s)
    q = WorkQueue([sample("a", "x", 1), p])
    assert q.pop() is p


def answered(sid: str, source: str, original: str, turns: int = 1) -> Sample:
    msgs: list[Message] = []
    for i in range(turns):
        msgs += [Message("user", f"q{sid}.{i}"), Message("assistant", original)]
    return Sample(f"{source}:{sid}", source, msgs)


def test_longer_original_answers_go_first_within_a_source() -> None:
    prompt_only = Sample("x:d", "x", [Message("user", "q")])
    q = WorkQueue([answered("a", "x", "w " * 10), answered("b", "x", "w " * 900),
                   answered("c", "x", "w " * 100), prompt_only])  # fmt: skip
    assert drain(q) == ["x:b", "x:c", "x:d", "x:a"]  # no original: the source's typical


def test_original_size_counts_reasoning_and_tool_calls_and_last_turn_only() -> None:
    calls = (ToolCall("c1", "search", '{"q": "' + "x" * 80 + '"}'),)
    msgs = [Message("user", "q"), Message("assistant", "ab", reasoning="cd" * 5),
            Message("user", "q2"), Message("assistant", "", tool_calls=calls)]  # fmt: skip
    s = Sample("x:1", "x", msgs)
    assert s.original_chars() == round((12 + 6 + len(calls[0].arguments)) / 2)
    last = Sample("x:1", "x", s.messages, turns="last")
    assert last.original_chars() == 6 + len(calls[0].arguments)
    assert Sample("x:2", "x", [Message("user", "only a prompt")]).original_chars() == 0


def test_slope_is_learned_and_an_uninformative_source_drifts_to_zero() -> None:
    m = LengthModel()
    assert m.slope("x") == PRIOR_SLOPE
    for i in range(400):  # answers ~ original chars (b = 1) in "x"; unrelated in "y"
        chars = 20 + (i * 37) % 2000
        m.observe("x", [chars // 4], chars)
        m.observe("y", [100 + (i * 53) % 300], chars)
    assert 0.9 < m.slope("x") <= 1.0
    assert m.slope("y") < 0.05
    assert m.verbosity("y", 2000) < 1.2  # the original says nothing in y
    m.set_queued([answered("c", "x", "w" * 200)])
    assert m.verbosity("x", 2000) > 5 * m.verbosity("x", 200)


def test_regression_state_survives_a_resume_through_schedule_json() -> None:
    m = LengthModel()
    for i in range(50):
        m.observe("x", [10 * (i + 1)], 40 * (i + 1))
    state = json.loads(json.dumps(m.state()))

    done = SimpleNamespace(sources={"x": SimpleNamespace(rows=50, completion_tokens=12750)})
    again = LengthModel.from_done(done, ["x"], state)
    assert again.slope("x") == m.slope("x") and again.sources["x"].turns == 50
    assert LengthModel.from_done(done, ["x"], {"version": 99}).slope("x") == PRIOR_SLOPE
    bad = {"version": 1, "sources": {"x": {"turns": 1}}}
    assert LengthModel.from_done(done, ["x"], bad).sources["x"].n == 0  # ignored, not fatal


def test_spilled_bodies_come_back_on_pop(tmp_path) -> None:
    samples = [answered(str(i), "x", "w " * (10 * i)) for i in range(1, 6)]
    with Spill(str(tmp_path)) as spill:
        packed = [PackedSample.pack(s, spill) for s in samples]
        assert all(p.blob == b"" for p in packed) and spill.size > 0
        q = WorkQueue(packed, spill=spill)
        out = [q.pop() for _ in range(5)]
        assert [unpacked(p).id for p in out] == [s.id for s in reversed(samples)]  # type: ignore[arg-type]
        assert [unpacked(p) for p in out] == list(reversed(samples))  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            packed[0].unpack()
    assert list(tmp_path.iterdir()) == []  # unlinked: nothing left behind


def test_slow_rebuilds_are_spaced_by_their_duration() -> None:
    clock = Clock()

    class SlowModel(LengthModel):
        def costs(self, items, which=None):  # type: ignore[no-untyped-def]
            n = len(items) if which is None else len(which)
            clock.t += 0.5 * n  # every re-key of a sample takes half a second of driver time
            return super().costs(items, which)

    q = WorkQueue([sample("a", "x", 1), sample("b", "y", 1)], SlowModel(), clock=clock)
    clock.t += REPRIORITISE_EVERY_S
    q.observe("y", [5000])
    assert q.rebuilds == 1  # took 1 s: the next one waits REBUILD_DUTY s
    clock.t += REPRIORITISE_EVERY_S
    q.observe("x", [9000, 9000, 9000])
    assert q.rebuilds == 1
    clock.t += REBUILD_DUTY
    assert q.maybe_reprioritise() and q.rebuilds == 2


def test_the_column_order_is_the_order_of_the_scalar_cost() -> None:
    """The queue computes costs for all samples at once; the order must be the one the scalar
    cost gives (most expensive first, ties in input order), after learning and re-keying too."""
    import heapq
    import random

    rng = random.Random(7)
    samples = [answered(str(i), rng.choice("abc"), "w " * rng.choice([0, 1, 5, 50, 400]),
                        turns=rng.choice([1, 1, 2, 3])) for i in range(300)]  # fmt: skip
    samples += [samples[5], samples[6]]  # exact ties with earlier ones
    clock = Clock()
    model = LengthModel()
    q = WorkQueue(samples, model, clock=clock)
    ref = [(-model.cost(s), i, s) for i, s in enumerate(samples)]
    heapq.heapify(ref)
    got, want = [], []
    for step in range(len(samples)):
        if step == 100:  # learn: sources diverge and slopes move; both re-key
            clock.t += REPRIORITISE_EVERY_S
            for k in range(40):
                q.model.observe("a", [2000 + k], 10 + 97 * k)
                q.model.observe("c", [20], 10 + 97 * k)
            assert q.maybe_reprioritise()
            ref = [(-model.cost(s), i, s) for _, i, s in ref]
            heapq.heapify(ref)
        got.append(q.pop())
        want.append(heapq.heappop(ref)[2])
    assert [s.id for s in got] == [s.id for s in want]  # type: ignore[union-attr]
    assert q.pop() is None and len(q) == 0
