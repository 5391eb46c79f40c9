"""A discrete-event model of regen's client and a fleet of servers with prefill and a prefix
cache (issue 43). Not a test; imported by ``benchmarks/prefill.py``.

The servers are the simulator's model (:mod:`regen.devkit.simulate.scheduler`), run on a
virtual clock instead of asyncio, with the simulator's own cache
(:class:`regen.devkit.simulate.prefix_cache.PrefixCache`):

- R batch slots; one decode step of ``step_s`` gives every decoding request one token;
- a request's prompt less what the prefix cache holds is prefilled in chunks of at most
  ``chunk`` tokens per step, each step lasting ``step_s`` + ``prefill_s_per_token`` per prompt
  token it takes; the request makes its first token in the step its prefill ends;
- the prefix cache is looked up and the prompt held when the request reaches the server; the
  prompt and the answer are held when it ends (so the conversation's next turn, which
  re-sends the answer, finds them).

Between events nothing changes, so a run of decode steps with no prefill pending is one jump
to the next request's end: the model costs O(requests × batch), not O(tokens).

The client is regen's (regen.engine.worker, router): ``R × endpoints`` sample slots; a sample
holds its slot from its first turn to its last and sends its next turn as soon as the previous
one returns (``next_turn="at_once"``), or, for comparison, puts it at the back of the queue of
samples not yet started (``"queued"``: turn by turn); the endpoint of a request is
``affinity`` (regen's router: the least loaded with room for a sample's first turn, the same
one for its later turns), ``least_loaded`` (every request to the least loaded, no binding) or
``random`` (every request to a random endpoint with room) or ``round_robin`` (every request
to the next endpoint in turn, room or not: a plain load balancer in front of the servers;
a request beyond a server's slots waits in its queue). Zero network latency.

In a saturated fleet ``least_loaded`` and ``random`` mostly send a conversation's next turn
back where it was: the slot its previous turn just freed is the only room there is. They
differ from ``affinity`` when servers have room (the start, the tail); ``round_robin`` is
affinity off at all times.

What a run reports (:class:`Outcome`): prompt and cached tokens (the hit rate), completion
tokens, the servers' busy time (the steps they ran: decode and prefill) and the prefill's part
of it, and the makespan (fleet time = endpoints × makespan: what the reserved GPUs cost).
"""

from __future__ import annotations

import collections
import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from regen.devkit.simulate.config import LARGE_MOE_PREFILL_US_PER_TOKEN
from regen.devkit.simulate.prefix_cache import PrefixCache, Segment

AFFINITY = ("affinity", "least_loaded", "random", "round_robin")
NEXT_TURN = ("at_once", "queued")


@dataclass(slots=True, frozen=True)
class Turn:
    """One request of a conversation: its prompt, its answer's length, and what the cache
    holds after it (the prompt and the answer as the next turn re-sends it)."""

    segments: tuple[Segment, ...]
    prompt: int
    completion: int
    after: tuple[Segment, ...]


@dataclass(slots=True, frozen=True)
class Conversation:
    source: str
    turns: tuple[Turn, ...]


@dataclass(slots=True, frozen=True)
class ServerParams:
    """One server (defaults: a large MoE on 8 GPUs, docs/simulate.md "Prefill")."""

    slots: int = 64
    step_s: float = 0.0032
    prefill_s_per_token: float = LARGE_MOE_PREFILL_US_PER_TOKEN / 1e6
    chunk: int = 8192
    cache_tokens: int = 2_000_000
    block_size: int = 1


@dataclass(slots=True)
class Outcome:
    prompt: int = 0
    cached: int = 0
    completion: int = 0
    requests: int = 0
    busy_s: float = 0.0
    prefill_s: float = 0.0
    makespan_s: float = 0.0
    endpoints: int = 1
    per_server_busy: list[float] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.cached / self.prompt if self.prompt else 0.0

    @property
    def busy_per_token(self) -> float:
        return self.busy_s / self.completion if self.completion else 0.0

    @property
    def fleet_per_token(self) -> float:
        return self.endpoints * self.makespan_s / self.completion if self.completion else 0.0


@dataclass(slots=True, eq=False)
class _Job:
    conv: int
    turn: int
    left: int  #: decode tokens still to make
    prefill: int  #: prompt tokens still to prefill
    after: tuple[Segment, ...]


class _Server:
    def __init__(self, p: ServerParams) -> None:
        self.p = p
        self.cache = PrefixCache(p.cache_tokens, p.block_size)
        self.running: list[_Job] = []
        self.waiting: collections.deque[tuple[_Job, tuple[Segment, ...], int]] = collections.deque()
        self.clock = 0.0  #: the time the state below is valid at (a step boundary)
        self.in_flight = 0  #: requests the client has here (running or waiting)
        self.busy = 0.0
        self.prefill_s = 0.0
        self.cached = 0
        self.prompt = 0
        #: the step in flight: (end time, tokens it prefills) or a decode jump (end, 0)
        self.next_at: float | None = None
        self.in_prefill_step = False

    # -- arrivals ---------------------------------------------------------------------------
    def arrive(self, job: _Job, segments: tuple[Segment, ...], prompt: int, now: float) -> None:
        self.in_flight += 1
        if not self.running:
            self.clock = max(self.clock, now)
        elif not self.in_prefill_step:  # a decode jump under way: bring it to this step
            steps = int((now - self.clock) / self.p.step_s)
            if steps > 0:
                self._decode(steps)
        self.waiting.append((job, segments, prompt))
        if not self.in_prefill_step:
            self._admit()
            self._plan()

    def _admit(self) -> None:
        p = self.p
        while self.waiting and len(self.running) < p.slots:
            job, segments, prompt = self.waiting.popleft()
            cached = self.cache.match(segments, prompt)
            self.cache.insert(segments)
            self.cached += cached
            self.prompt += prompt
            job.prefill = max(1, prompt - cached) if p.prefill_s_per_token else 0
            self.running.append(job)

    # -- steps ------------------------------------------------------------------------------
    def _plan(self) -> None:
        if not self.running:
            self.next_at = None
            self.in_prefill_step = False
            return
        p = self.p
        pending = sum(1 for j in self.running if j.prefill)
        if pending:
            left, n = p.chunk, 0
            for j in self.running:
                if j.prefill:
                    take = min(j.prefill, left)
                    n += take
                    left -= take
                    if not left:
                        break
            self.in_prefill_step = True
            self.next_at = self.clock + p.step_s + n * p.prefill_s_per_token
        else:
            k = min(j.left for j in self.running)
            self.in_prefill_step = False
            self.next_at = self.clock + k * p.step_s

    def _decode(self, steps: int) -> None:
        for j in self.running:
            j.left -= steps
        self.clock += steps * self.p.step_s
        self.busy += steps * self.p.step_s

    def step(self) -> list[_Job]:
        """Run the step (or jump) in flight; returns the jobs it finished."""
        assert self.next_at is not None
        p = self.p
        if self.in_prefill_step:
            left = p.chunk
            n = 0
            for j in self.running:
                if not j.prefill:
                    j.left -= 1
                elif left:
                    take = min(j.prefill, left)
                    j.prefill -= take
                    n += take
                    left -= take
                    if not j.prefill:
                        j.left -= 1  # the prefill's token
            spent = self.next_at - self.clock
            self.busy += spent
            self.prefill_s += n * p.prefill_s_per_token
            self.clock = self.next_at
        else:
            self._decode(round((self.next_at - self.clock) / p.step_s))
        done = [j for j in self.running if j.left <= 0 and not j.prefill]
        if done:
            self.running = [j for j in self.running if j.left > 0 or j.prefill]
            for j in done:
                self.cache.insert(j.after)
                self.in_flight -= 1
        self.in_prefill_step = False
        self._admit()
        self._plan()
        return done


def run(
    conversations: Sequence[Conversation],
    order: Sequence[int],
    *,
    endpoints: int,
    affinity: str = "affinity",
    next_turn: str = "at_once",
    params: ServerParams | None = None,
    seed: int = 0,
) -> Outcome:
    """Regen's client over ``endpoints`` servers, samples started in ``order``."""
    if affinity not in AFFINITY or next_turn not in NEXT_TURN:
        raise ValueError(f"affinity in {AFFINITY}, next_turn in {NEXT_TURN}")
    p = params or ServerParams()
    servers = [_Server(p) for _ in range(endpoints)]
    rng = random.Random(seed)
    queue: collections.deque[tuple[int, int]] = collections.deque((c, 0) for c in order)
    bound: dict[int, int] = {}
    turn_of_rr = 0
    free_slots = p.slots * endpoints
    out = Outcome(endpoints=endpoints)
    now = 0.0

    def pick(conv: int) -> int:
        nonlocal turn_of_rr
        if affinity == "affinity" and conv in bound:
            return bound[conv]
        if affinity == "round_robin":
            turn_of_rr += 1
            return turn_of_rr % endpoints
        room = [i for i, s in enumerate(servers) if s.in_flight < p.slots]
        if affinity == "random":
            i = rng.choice(room)
        else:
            i = min(room, key=lambda k: (servers[k].in_flight, k))
        bound[conv] = i
        return i

    def send(conv: int, turn: int) -> None:
        t = conversations[conv].turns[turn]
        job = _Job(conv, turn, t.completion, 0, t.after)
        servers[pick(conv)].arrive(job, t.segments, t.prompt, now)
        out.requests += 1
        out.completion += t.completion

    def start() -> None:
        nonlocal free_slots
        while free_slots and queue:
            conv, turn = queue.popleft()
            free_slots -= 1
            send(conv, turn)

    start()
    while True:
        live = [s for s in servers if s.next_at is not None]
        if not live:
            break
        s = min(live, key=lambda x: x.next_at or 0.0)
        now = s.next_at or now
        for job in s.step():
            nxt = job.turn + 1
            if nxt < len(conversations[job.conv].turns):
                if next_turn == "at_once":
                    send(job.conv, nxt)
                    continue
                queue.append((job.conv, nxt))  # its binding stays (regen forgets at the end)
            else:
                bound.pop(job.conv, None)
            free_slots += 1
        start()
    out.makespan_s = now
    for s in servers:
        out.prompt += s.prompt
        out.cached += s.cached
        out.busy_s += s.busy
        out.prefill_s += s.prefill_s
        out.per_server_busy.append(s.busy)
    return out


def after_segments(
    segments: tuple[Segment, ...], next_segments: tuple[Segment, ...] | None, unique: Hashable,
    completion: int,
) -> tuple[Segment, ...]:  # fmt: skip
    """What a turn leaves in the cache: its prompt (less the generation prompt) and its answer
    as the next turn re-sends it (the last turn: a segment of its own)."""
    n = len(segments)
    if next_segments is not None and len(next_segments) >= n:
        return next_segments[:n]
    return (*segments[:-1], (unique, completion + segments[-1][1]))
