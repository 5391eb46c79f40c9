"""An actor's row builder loads in a thread: ``ready()`` waits for it without blocking the event
loop, and an exchange with ``hold`` starts its samples only once it is loaded (a session that
read its sources); without ``hold`` (a resume from the plan index) they start at once."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from regen.engine import actor as actor_mod
from regen.engine.actor import LazyRows, WorkerActor


class Gate:
    """A row builder factory that returns only when released."""

    def __init__(self, fail: bool = False) -> None:
        self.release = threading.Event()
        self.fail = fail

    def __call__(self, settings: Any) -> Any:
        assert self.release.wait(10)
        if self.fail:
            raise OSError("no tokenizer here")
        return lambda sample, turns: [{"turn": 0}]


class Box:
    """Stands in for the Mailbox: records when samples were handed over."""

    def __init__(self) -> None:
        self.got: list[list[Any]] = []

    async def exchange(self, samples: list[Any], wait_s: float, low_water: int) -> Any:
        self.got.append(samples)

        class Reply:
            def wire(self) -> tuple[int, ...]:
                return (len(samples),)

        return Reply()


def actor_with(rows: LazyRows) -> WorkerActor:
    a = WorkerActor.__new__(WorkerActor)  # the parts exchange uses, no clients or Ray
    a.rows = rows
    a.mailbox = Box()  # type: ignore[assignment]
    return a


@pytest.mark.parametrize("fail", [False, True])
def test_ready_waits_for_the_load_without_blocking_the_loop(monkeypatch, fail) -> None:
    gate = Gate(fail)
    monkeypatch.setattr(actor_mod, "default_row_builder", gate)
    rows = LazyRows(None)  # type: ignore[arg-type]

    async def main() -> None:
        waiter = asyncio.ensure_future(rows.ready())
        ticks = 0
        for _ in range(20):  # the loop runs while the load is held back
            await asyncio.sleep(0.01)
            ticks += 1
        assert not waiter.done() and ticks == 20
        gate.release.set()
        await asyncio.wait_for(waiter, 5)
        await asyncio.wait_for(rows.ready(), 1)  # loaded: returns at once

    asyncio.run(main())
    assert bool(rows.problem()) == fail


def test_hold_starts_samples_only_once_loaded(monkeypatch) -> None:
    gate = Gate()
    monkeypatch.setattr(actor_mod, "default_row_builder", gate)
    a = actor_with(LazyRows(None))  # type: ignore[arg-type]
    box = a.mailbox

    async def main() -> None:
        held = asyncio.ensure_future(a.exchange(["s1"], 1.0, -1, True))
        assert await a.exchange([], 1.0, -1, True) == (0,)  # nothing to start: no wait
        await asyncio.sleep(0.1)
        assert not held.done() and box.got == [[]]  # type: ignore[attr-defined]
        gate.release.set()
        assert await asyncio.wait_for(held, 5) == (1,)
        assert box.got == [[], ["s1"]]  # type: ignore[attr-defined]

    asyncio.run(main())


def test_without_hold_samples_start_while_it_loads(monkeypatch) -> None:
    gate = Gate()
    monkeypatch.setattr(actor_mod, "default_row_builder", gate)
    a = actor_with(LazyRows(None))  # type: ignore[arg-type]

    async def main() -> None:
        assert await asyncio.wait_for(a.exchange(["s1"], 1.0, -1), 1) == (1,)

    try:
        asyncio.run(main())
    finally:
        gate.release.set()
