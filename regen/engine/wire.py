"""The wire protocol with the actors: samples and outcomes in batches. Owns no files.

One call, ``exchange(samples)``, hands a worker new samples and returns every outcome
finished since its last reply, so a call's fixed cost (a Ray actor call costs the driver
~0.3-2 ms of CPU on a busy machine) is paid per batch, not per sample. A worker has one
exchange in flight at a time; its reply also carries its counters
(:meth:`regen.engine.worker.SampleWorker.snapshot`) every ``SNAPSHOT_EVERY_S`` and whenever it
has nothing left in progress, so the driver's progress needs no calls of its own.

An exchange answers once the worker needs work: fewer than ``low_water`` of its samples wait
for a slot (the driver feeds ``prefetch`` beyond the slots and asks back at half of it; it
asks with ``low_water`` -1 when it has nothing left to feed). Otherwise it answers when its
first outcome has waited ``LINGER_S`` for more, when ``MAX_BATCH`` are ready, or after
``wait_s`` with none. Every reply says how many samples are still in their requests
(``active``: holding or waiting for a slot): samples whose answers are in but whose rows are
still being built (the tokenizer still loading, say) take no slot, and the driver feeds by
``active``, so the servers never wait for row building. So a reply comes when the worker
needs more work, not per sample, and no server slot waits for it.

Every finished sample comes back ready to store (:func:`pack`, in the worker, off its event
loop): its journal line (the bytes of :meth:`regen.store.completed.CompletedSample.to_line`),
its rows as part of one Arrow table per reply (``regen.store.schema.SCHEMA``, sent as Arrow
IPC bytes:
~7x cheaper to read than a pickled table), the counters of its rows and their completion
tokens: a :class:`PackedOutcome`, the one form the driver stores. The driver neither encodes
JSON nor converts rows. A sample whose rows do not convert to the schema cannot become a
training row: it comes back as a permanent failure (kind ``row``), recorded like any other.

:class:`Mailbox` is the worker's side (inside a Ray actor).
A worker that cannot go on (its row builder could not start, or ``process`` raised: a bug)
says so in every later reply (``error``); the driver then takes back everything it held.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from regen.core.errors import RegenError
from regen.core.sample import Sample
from regen.engine.worker import Row, SampleOutcome, WorkerSnapshot
from regen.plan.packed import QueueItem, unpacked
from regen.store.completed import CompletedSample
from regen.store.counts import SourceCounts, count_rows, output_tokens
from regen.store.schema import rows_to_table

log = logging.getLogger(__name__)

#: rows -> their Arrow table (regen.store.schema.rows_to_table)
ToTable = Callable[[list[Row]], pa.Table]
#: a packed outcome's fields, as plain data (:meth:`Reply.wire`)
PackedFields = dict[str, Any]
#: a :class:`Reply` as plain data: packed outcomes, other outcomes, the rows' Arrow stream,
#: slots, error, init_failed, snapshot, active
WireReply = tuple[
    list[PackedFields], list[SampleOutcome], bytes, int, str, bool, WorkerSnapshot | None, int
]


class Processor(Protocol):
    """What a :class:`Mailbox` needs of its worker (a
    :class:`regen.engine.worker.SampleWorker`): ``process``; its ``slots`` and ``snapshot``
    are read where it has them."""

    async def process(self, sample: Sample) -> SampleOutcome: ...


#: seconds a collect lingers at most after its first outcome, gathering more
LINGER_S = 1.0
#: an exchange returns at once when this many outcomes are ready
MAX_BATCH = 256
#: seconds between the counters snapshots a worker attaches to its replies
SNAPSHOT_EVERY_S = 1.0
#: seconds between looks at the worker's waiting samples while an exchange waits
POLL_S = 0.05


@dataclass(slots=True)
class PackedOutcome(SampleOutcome):
    """A finished sample as the driver stores it (``rows`` stay empty: they are ``table``)."""

    line: bytes = b""  #: its journal line
    first: int = 0  #: its rows in the reply's table: [first, first + nrows)
    nrows: int = 0
    counts: SourceCounts | None = None  #: counters of its rows (done = 1)
    tokens: list[int] = field(default_factory=list)  #: completion tokens per row
    table: pa.Table | None = None  #: its rows (set by the driver from the reply's table)


@dataclass(slots=True)
class Reply:
    """What one collect returns (sent as :meth:`wire`: plain data that Ray encodes with
    msgpack, ~10x cheaper to read than pickled dataclasses and pydantic counters)."""

    outcomes: list[SampleOutcome]
    rows: bytes = b""  #: rows of the packed outcomes, in order (Arrow IPC stream)
    slots: int = 0  #: the worker's slots now (0: unknown)
    error: str = ""  #: the worker cannot go on: one line
    init_failed: bool = False  #: ... because it could not start
    snapshot: WorkerSnapshot | None = None  #: the worker's counters, when attached
    #: samples in their requests (holding or waiting for a slot); -1: the worker cannot tell
    active: int = -1

    def wire(self) -> WireReply:
        packed: list[PackedFields] = []
        other: list[SampleOutcome] = []
        for o in self.outcomes:
            if isinstance(o, PackedOutcome):
                d = {f.name: getattr(o, f.name) for f in OUTCOME_FIELDS if f.name != "rows"}
                counts = o.counts.model_dump() if o.counts is not None else None
                d.update(line=o.line, first=o.first, nrows=o.nrows, tokens=o.tokens, counts=counts)
                packed.append(d)
            else:
                other.append(o)
        return (packed, other, self.rows, self.slots, self.error, self.init_failed,
                self.snapshot, self.active)  # fmt: skip

    @classmethod
    def from_wire(cls, data: WireReply) -> Reply:
        packed, other, rows, slots, error, init_failed, snapshot, active = data
        outcomes: list[SampleOutcome] = list(other)
        for d in packed:
            counts = d.pop("counts")
            sc = SourceCounts(**counts) if counts else None
            outcomes.append(PackedOutcome(**d, counts=sc))
        return cls(outcomes, rows, slots, error, init_failed, snapshot, active)


def pack(outcomes: list[SampleOutcome], to_table: ToTable) -> Reply:
    """The reply of ``outcomes``: every done one packed (journal line, rows in one table); one
    whose rows do not convert is a permanent failure of its sample (module docstring)."""
    done = [o for o in outcomes if o.status == "done"]
    table = None
    if done:
        try:
            table = to_table([r for o in done for r in o.rows])
        except CONVERT_ERRORS as e:
            log.warning("rows of a reply do not convert (%s): converting sample by sample", e)
            outcomes, table = _one_by_one(outcomes, to_table)
    out: list[SampleOutcome] = []
    first = 0
    for o in outcomes:
        if o.status != "done":
            out.append(o)
            continue
        rows = o.rows
        same = {f.name: getattr(o, f.name) for f in OUTCOME_FIELDS}
        same["rows"] = []
        line = CompletedSample(o.sample_id, o.source, rows).to_line()
        out.append(PackedOutcome(**same, line=line, first=first, nrows=len(rows),
                                 counts=count_rows(rows), tokens=output_tokens(rows)))  # fmt: skip
        first += len(rows)
    return Reply(out, ipc_bytes(table) if table is not None and first else b"")


#: what converting rows may raise (rows that do not fit regen.store.schema.SCHEMA)
CONVERT_ERRORS = (RegenError, pa.ArrowException, TypeError, ValueError)


def _one_by_one(
    outcomes: list[SampleOutcome], to_table: ToTable
) -> tuple[list[SampleOutcome], pa.Table | None]:
    """The outcomes with each done sample's rows converted alone: one whose rows do not
    convert becomes a permanent failure (kind ``row``); and the table of the others' rows."""
    out: list[SampleOutcome] = []
    tables = []
    for o in outcomes:
        if o.status == "done":
            try:
                tables.append(to_table(o.rows))
            except CONVERT_ERRORS as e:
                why = f"its rows do not convert to the Parquet schema: {type(e).__name__}: {e}"
                log.warning("sample %s: %s", o.sample_id, why)
                o = dataclasses.replace(o, rows=[], status="permanent", kind="row",
                                        message=why[:500])  # fmt: skip
        out.append(o)
    return out, pa.concat_tables(tables) if tables else None


def ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


#: the fields a packed outcome copies from its SampleOutcome
OUTCOME_FIELDS = dataclasses.fields(SampleOutcome)


def unpack_reply(reply: Reply) -> list[SampleOutcome]:
    """The reply's outcomes, each packed one with its slice of the reply's table."""
    table = pa.ipc.open_stream(reply.rows).read_all() if reply.rows else None
    for o in reply.outcomes:
        if isinstance(o, PackedOutcome) and table is not None:
            o.table = table.slice(o.first, o.nrows)
    return reply.outcomes


def default_to_table(rows: list[Row]) -> pa.Table:

    return rows_to_table(rows)


class Mailbox:
    """A worker's side of the batches: :meth:`exchange` starts samples on the running loop and
    returns what finished. ``worker`` has ``async process(sample)`` and ``snapshot()`` (a
    :class:`regen.engine.worker.SampleWorker`); ``problem()`` says why it cannot go on
    ("" while it can)."""

    def __init__(
        self,
        worker: Processor,
        *,
        to_table: ToTable = default_to_table,
        problem: Callable[[], str] | None = None,
        linger_s: float = LINGER_S,
    ) -> None:
        self.worker = worker
        self.to_table = to_table
        self.problem = problem or (lambda: "")
        self.linger_s = linger_s
        self.error = ""  #: set when process() raised (a bug): the worker is unusable
        self._out: list[SampleOutcome] = []
        self._first_at = 0.0  #: when the oldest outcome in the outbox arrived
        self._wake: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = 0  #: samples started and not finished
        self._snapshot_at = -SNAPSHOT_EVERY_S

    def _event(self) -> asyncio.Event:
        if self._wake is None:
            self._wake = asyncio.Event()
        return self._wake

    def submit(self, samples: list[QueueItem]) -> None:
        """Start every sample (call on the worker's event loop)."""
        loop = asyncio.get_running_loop()
        for s in samples:
            task = loop.create_task(self._run(s))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, sample: QueueItem) -> None:
        self._running += 1
        try:
            out = await self.worker.process(unpacked(sample))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # process() never raises: a bug; the worker is unusable
            log.exception("worker failed on %s", getattr(sample, "id", "?"))
            self.error = self.error or f"{type(e).__name__}: {e}"
        else:
            if not self._out:
                self._first_at = time.monotonic()
            self._out.append(out)
        finally:
            self._running -= 1
        self._event().set()

    def _waiting(self) -> int | None:
        """Samples of this worker waiting for a slot (None when it cannot tell)."""
        slots = getattr(self.worker, "slots", None)
        waiting = getattr(slots, "waiting", None)
        return None if waiting is None else int(waiting)

    def _active(self) -> int:
        """Samples in their requests: holding a slot or waiting for one (-1: cannot tell)."""
        slots = getattr(self.worker, "slots", None)
        used, waiting = getattr(slots, "used", None), self._waiting()
        return -1 if used is None or waiting is None else int(used) + waiting

    async def exchange(self, samples: list[QueueItem], wait_s: float, low_water: int = -1) -> Reply:
        """Start ``samples``; return the outcomes finished since the last reply (module
        docstring: when it answers), with the worker's counters now and then."""
        self.submit(samples)
        reply = await self.collect(wait_s, low_water)
        now = time.monotonic()
        snap = getattr(self.worker, "snapshot", None)
        idle = self._running == 0
        if snap is not None and (idle or now - self._snapshot_at >= SNAPSHOT_EVERY_S):
            self._snapshot_at = now
            reply.snapshot = snap()
        return reply

    async def collect(self, wait_s: float, low_water: int = -1) -> Reply:
        """Outcomes finished since the last reply (module docstring: when it answers)."""
        wake = self._event()
        now = time.monotonic()
        deadline = now + wait_s
        while not (self.error or self.problem() or len(self._out) >= MAX_BATCH):
            waiting = self._waiting()
            if low_water >= 0 and (waiting <= low_water if waiting is not None else self._out):
                break  # it needs more work (or cannot tell, and has an outcome): answer now
            until = self._first_at + self.linger_s if self._out else deadline
            if now >= until:
                break
            poll = POLL_S if low_water >= 0 and waiting is not None else until - now
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), min(until - now, poll))
            now = time.monotonic()
        outs, self._out = self._out, []
        problem = self.problem()
        if self.error or problem:
            return Reply(outs, error=self.error or problem, init_failed=bool(problem))
        if outs:
            reply = await asyncio.to_thread(pack, outs, self.to_table)
        else:
            reply = Reply(outs)
        slots = getattr(self.worker, "slots", None)
        reply.slots = int(getattr(slots, "capacity", 0) or 0)
        reply.active = self._active()
        return reply

    def cancel_all(self) -> None:
        """Cancel every sample in progress."""
        for t in list(self._tasks):
            t.cancel()
