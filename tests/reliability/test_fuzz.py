"""benchmarks/fuzz.py at CI size: every row of the demo's sources and 3 hostile mutants of it
through plan, run (against ``regen simulate``, on the test session's Ray head), status, verify
and export (issue 42, item 3; the full size, 30 mutants a row at seeds 1 to 5, is
``python -m benchmarks.fuzz``)."""

from __future__ import annotations

import random

import pytest

from benchmarks.fuzz import mutate_line, one_seed

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

MUTANTS = 3


def test_mutants_are_seeded_and_hostile() -> None:
    line = b'{"id": "a", "conversations": [{"from": "human", "value": "hi"}]}'
    first = [mutate_line(line, random.Random(7)) for _ in range(1)]
    assert first == [mutate_line(line, random.Random(7))]
    many = [mutate_line(line, random.Random(s)) for s in range(200)]
    assert all(b"\n" not in m for m in many)
    assert len(set(many)) > 100
    assert any(b"\\ud800" in m for m in many) and any(m.startswith(b"\xef\xbb\xbf") for m in many)


def test_every_command_holds_on_mutated_sources(tmp_path, ray_head, ray_env) -> None:
    rep = one_seed(tmp_path, 1, MUTANTS, ray_head.address, ray_env)
    assert rep.problems == [], (rep.problems, rep.crashing_rows)
    assert [c.name for c in rep.commands] == ["plan", "run", "status", "verify", "export"]
    assert rep.read == rep.lines > 300
    assert rep.kept == rep.done + rep.failed > 50
    assert len(rep.rejected) >= 8, rep.rejected  # the mutants meet many of the checks
