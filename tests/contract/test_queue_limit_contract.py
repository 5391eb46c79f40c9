"""SGLang's ``--max-queued-requests``, which regen paces a start by, held against the wheel.

regen reads it from ``/server_info`` (the server's resolved arguments, top level), times
``dp_size``, because every data-parallel scheduler applies it to its own waiting queue and
refuses an arriving request once ``len(waiting_queue) + 1`` would pass it, free batch slots or
not (regen.engine.adaptive). The simulator's ``/server_info`` says the same, and the start
check reads it.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import _sglang

from regen.client.endpoints import check_endpoints
from regen.client.profiles.sglang import identity_of, queue_limit
from regen.devkit.simulate.testing import simulator_in_thread
from regen.manifest import Endpoint

MODEL = "moonshotai/Kimi-K2.5"  #: the simulator's default served model


def srt(*parts: str) -> Path:
    return _sglang.wheel_root().joinpath("srt", *parts)


def annotated_fields(path: Path) -> dict[str, str]:
    """``name: annotation`` of every class-level annotated field in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.target.id: ast.unparse(node.annotation)
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }


def method_source(path: Path, name: str) -> str:
    text = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(text, node) or ""
    raise AssertionError(f"{name} is not in {path}")


def test_the_flag_and_dp_size_are_server_arguments_of_the_wheel() -> None:
    _sglang.check_version()
    schedule = annotated_fields(srt("arg_groups", "fields", "schedule.py"))
    parallel = annotated_fields(srt("arg_groups", "fields", "parallel.py"))
    assert schedule["max_queued_requests"].startswith("A[Optional[int]")
    assert parallel["dp_size"].startswith("A[int")


def test_each_scheduler_refuses_past_the_flag_on_its_own_waiting_queue() -> None:
    body = method_source(srt("managers", "scheduler.py"), "_abort_on_queued_limit")
    assert "len(self.waiting_queue) + 1 <= self.max_queued_requests" in body
    assert '"The request queue is full."' in body


def test_the_queue_limit_is_read_over_the_data_parallel_ranks() -> None:
    assert queue_limit({"max_queued_requests": 6, "dp_size": 4}) == 24
    assert queue_limit({"max_queued_requests": 6}) == 6
    assert queue_limit({"max_queued_requests": None, "dp_size": 4}) is None
    assert queue_limit({"max_queued_requests": True}) is None
    assert identity_of({"max_queued_requests": 5, "dp_size": 1}).max_queued_requests == 5


def test_the_start_check_reads_the_simulators_queue_limit() -> None:
    with (
        simulator_in_thread(max_queued_requests=3, dp_size=2, memory_slots=8) as q,
        simulator_in_thread(instant=True) as free,
    ):
        infos = asyncio.run(check_endpoints([Endpoint(url=q.url), Endpoint(url=free.url)], MODEL))
    assert [i.max_queued_requests for i in infos] == [6, None]
