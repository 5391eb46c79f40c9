"""Batches between the driver and a worker: outcomes packed in the worker give the same journal
lines and byte-identical parts; replies come when the worker needs work, not per sample; a
worker that cannot go on says so; the wire format round-trips."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pyarrow as pa
import pytest

from regen.core.sample import Message, Sample
from regen.engine.wire import Mailbox, PackedOutcome, Reply, pack, unpack_reply
from regen.engine.worker import SampleOutcome
from regen.store import RunDir, layout
from regen.store.completed import CompletedSample
from regen.store.counts import count_rows
from regen.store.parts import part_bytes, samples_table
from regen.store.schema import SCHEMA, rows_to_table
from regen.store.segments import Journal


def rows_of(sid: str, turns: int, rng: random.Random) -> list[dict[str, Any]]:
    """Rows with every column filled, nulls and non-ASCII text included."""
    out = []
    for t in range(turns):
        r: dict[str, Any] = {}
        for f in SCHEMA:
            if f.name == "sample_id":
                r[f.name] = sid
            elif f.name == "source":
                r[f.name] = sid.split(":")[0]
            elif f.name == "turn":
                r[f.name] = t
            elif pa.types.is_list(f.type) and pa.types.is_string(f.type.value_type):
                r[f.name] = rng.sample(["repetition", "refusal", "é"], rng.randrange(3))
            elif pa.types.is_list(f.type):
                r[f.name] = [rng.randrange(2) for _ in range(rng.randrange(1, 40))]
            elif pa.types.is_string(f.type):
                pick = rng.choice(["", "plain", "é ü — 漢字", '{"a": [1, 2]}'])
                r[f.name] = pick if not f.nullable or rng.random() < 0.8 else None
            elif pa.types.is_boolean(f.type):
                r[f.name] = rng.random() < 0.5
            elif pa.types.is_floating(f.type):
                r[f.name] = rng.random() if rng.random() < 0.8 else None
            else:
                r[f.name] = rng.randrange(1000)
        out.append(r)
    return out


def outcomes(n: int, seed: int = 0) -> list[SampleOutcome]:
    rng = random.Random(seed)
    return [SampleOutcome(f"s:{i}", "s", rows_of(f"s:{i}", rng.randrange(1, 4), rng), slots=9)
            for i in range(n)]  # fmt: skip


def test_packed_outcomes_store_the_same_lines_and_byte_identical_parts() -> None:
    outs = outcomes(40)
    outs.insert(7, SampleOutcome("s:x", "s", status="permanent", kind="bad_request"))
    want_part = part_bytes(rows_to_table([r for o in outs for r in o.rows]), 40)
    stored: list[CompletedSample] = []
    for chunk in (outs[:13], outs[13:14], outs[14:]):  # three replies
        reply = Reply.from_wire(pack(chunk, rows_to_table).wire())
        for o in unpack_reply(reply):
            if isinstance(o, PackedOutcome):
                assert o.rows == [] and o.table is not None
                src = next(x for x in outs if x.sample_id == o.sample_id)
                assert o.line == CompletedSample(src.sample_id, src.source, src.rows).to_line()
                assert o.counts == count_rows(src.rows)
                assert o.tokens == [r["completion_tokens"] for r in src.rows]
                assert o.slots == 9
                stored.append(CompletedSample(o.sample_id, o.source, [], line=o.line,
                                              table=o.table, own=o.counts))  # fmt: skip
            else:
                assert o.status == "permanent" and o.kind == "bad_request"
    table = samples_table(stored, rows_to_table)
    assert table is not None and part_bytes(table, 40) == want_part


def test_a_journal_mixing_packed_and_plain_samples_writes_the_same_part(tmp_path) -> None:
    outs = outcomes(12, seed=3)
    ref = RunDir.open(tmp_path / "ref")
    j = Journal(ref, "s")
    for o in outs:
        j.append(CompletedSample(o.sample_id, o.source, o.rows))
    j.close()
    mixed = RunDir.open(tmp_path / "mixed")
    j2 = Journal(mixed, "s")
    packed = unpack_reply(Reply.from_wire(pack(outs[3:9], rows_to_table).wire()))
    for o in outs[:3]:  # e.g. native rows stored by the driver itself
        j2.append(CompletedSample(o.sample_id, o.source, o.rows))
    for p in packed:
        assert isinstance(p, PackedOutcome)
        j2.append(CompletedSample(p.sample_id, p.source, [], line=p.line, table=p.table,
                                  own=p.counts))  # fmt: skip
    for o in outs[9:]:
        j2.append(CompletedSample(o.sample_id, o.source, o.rows))
    j2.close()
    name = layout.part_path("s-00000")
    assert mixed.read_bytes(name) == ref.read_bytes(name)
    assert layout.part_record_file("s-00000").read(mixed) is not None


def test_a_new_attempt_packed_stores_the_same_line_and_record(tmp_path) -> None:
    """--retry-flagged: the driver adds what the new attempt replaces to a packed line."""
    o = outcomes(1, seed=3)[0]
    old = count_rows(outcomes(1, seed=4)[0].rows)
    plain = CompletedSample(o.sample_id, o.source, o.rows, old)
    (p,) = unpack_reply(Reply.from_wire(pack([o], rows_to_table).wire()))
    assert isinstance(p, PackedOutcome)
    packed = CompletedSample(p.sample_id, p.source, [], old, line=p.line, table=p.table,
                             own=p.counts)  # fmt: skip
    assert packed.to_line() == plain.to_line() and b'"replaces":{' in plain.to_line()
    assert packed.counts() == plain.counts() and plain.counts().retried == 1
    for name, sample in (("plain", plain), ("packed", packed)):
        j = Journal(RunDir.open(tmp_path / name), "s")
        j.append(sample)
        j.close()
    a, b = RunDir.open(tmp_path / "plain"), RunDir.open(tmp_path / "packed")
    part, rec = layout.part_path("s-00000"), layout.part_record_file("s-00000")
    assert a.read_bytes(part) == b.read_bytes(part)
    assert rec.read(a).sources == rec.read(b).sources


def test_a_sample_whose_rows_do_not_convert_is_a_permanent_failure_of_its_own() -> None:
    outs = outcomes(3, seed=5)
    outs.insert(1, SampleOutcome("s:bad", "s", [{"turn": 0, "completion_tokens": 3}], slots=9))
    back = unpack_reply(Reply.from_wire(pack(outs, rows_to_table).wire()))
    bad = next(o for o in back if o.sample_id == "s:bad")
    assert not isinstance(bad, PackedOutcome)
    assert (bad.status, bad.kind, bad.rows) == ("permanent", "row", [])
    assert "do not convert to the Parquet schema" in bad.message
    good = [o for o in back if isinstance(o, PackedOutcome)]
    assert [o.sample_id for o in good] == [o.sample_id for o in outs if o.sample_id != "s:bad"]
    for o in good:  # the others are stored as if the bad one had not been in the reply
        src = next(x for x in outs if x.sample_id == o.sample_id)
        assert o.table is not None and o.table.equals(rows_to_table(src.rows))


class Scripted:
    """A worker whose samples finish when the test says so."""

    def __init__(self, capacity: int) -> None:
        self.slots = type("S", (), {"capacity": capacity, "waiting": 0})()
        self.gates: dict[str, asyncio.Event] = {}
        self.calls = 0

    async def process(self, sample: Sample) -> SampleOutcome:
        gate = self.gates.setdefault(sample.id, asyncio.Event())
        await gate.wait()
        if sample.id == "s:boom":
            raise RuntimeError("a bug")
        return SampleOutcome(sample.id, sample.source, [{"turn": 0}], slots=self.slots.capacity)

    def snapshot(self) -> dict[str, Any]:
        self.calls += 1
        return {"calls": self.calls}


def sample(i: int | str) -> Sample:
    return Sample(f"s:{i}", "s", [Message("user", f"q{i}")])


#: a deadline no reply may wait for: a reply that returns before LONG / 2 answered for its
#: reason (a linger, the low water), not at the deadline, however slow the machine
LONG = 60.0


def test_a_reply_lingers_while_the_worker_has_work_waiting() -> None:
    async def go() -> None:
        w = Scripted(2)
        box = Mailbox(w, to_table=pa.Table.from_pylist, linger_s=0.3)
        w.slots.waiting = 5  # plenty queued: no hurry
        t0 = asyncio.get_running_loop().time()
        task = asyncio.ensure_future(box.exchange([sample(i) for i in range(3)], LONG, 1))
        await asyncio.sleep(0.01)
        w.gates["s:0"].set()
        await asyncio.sleep(0.05)
        w.gates["s:1"].set()
        reply = await task
        waited = asyncio.get_running_loop().time() - t0
        assert [o.sample_id for o in reply.outcomes] == ["s:0", "s:1"]
        assert 0.25 < waited < LONG / 2  # lingered for more, not until the deadline
        assert reply.snapshot == {"calls": 1} and reply.slots == 2

        w.slots.waiting = 1  # at the low water: it needs work, answer at once (even empty)
        t0 = asyncio.get_running_loop().time()
        reply = await box.exchange([], LONG, 1)
        assert reply.outcomes == [] and asyncio.get_running_loop().time() - t0 < LONG / 2

        t0 = asyncio.get_running_loop().time()  # nothing more to give (-1): wait for outcomes
        task = asyncio.ensure_future(box.exchange([], LONG, -1))
        await asyncio.sleep(0.1)
        w.gates["s:2"].set()
        reply = await task
        assert [o.sample_id for o in reply.outcomes] == ["s:2"]
        assert 0.05 < asyncio.get_running_loop().time() - t0 < LONG / 2  # lingered 0.3 s
        assert reply.snapshot == {"calls": 2}  # nothing left in progress: fresh counters

        t0 = asyncio.get_running_loop().time()
        reply = await box.exchange([], 0.1, -1)  # nothing finishes: answers empty
        assert reply.outcomes == [] and reply.snapshot is not None
        assert asyncio.get_running_loop().time() - t0 > 0.08  # answered at its own deadline

    asyncio.run(go())


def test_a_worker_that_cannot_go_on_says_so_in_every_reply() -> None:
    async def go() -> None:
        w = Scripted(2)
        box = Mailbox(w, to_table=pa.Table.from_pylist, linger_s=0.0)
        task = asyncio.ensure_future(box.exchange([sample("boom"), sample(1)], 2.0))
        await asyncio.sleep(0.01)
        w.gates["s:boom"].set()
        reply = await task
        assert reply.error == "RuntimeError: a bug" and not reply.init_failed
        problem = ["TemplateError: no tokenizer"]
        box2 = Mailbox(Scripted(1), to_table=pa.Table.from_pylist, problem=lambda: problem[0])
        reply = await box2.exchange([sample(2)], 2.0)
        assert reply.error == problem[0] and reply.init_failed
        box.cancel_all()
        box2.cancel_all()

    asyncio.run(go())


@pytest.mark.parametrize("n", [0, 1, 5])
def test_the_wire_format_round_trips(n: int) -> None:
    outs = outcomes(n, seed=n)
    outs.append(SampleOutcome("s:t", "s", status="transient", kind="timeout", http_status=None,
                              message="m", attempts=4, requests=4))  # fmt: skip
    reply = pack(outs, rows_to_table)
    reply.slots, reply.snapshot = 7, {"sent": 3}
    back = Reply.from_wire(reply.wire())
    assert (back.rows, back.slots, back.snapshot) == (reply.rows, 7, {"sent": 3})
    assert back.outcomes[0] == reply.outcomes[-1]  # the failed ones come first
    assert back.outcomes[1:] == reply.outcomes[:-1]
