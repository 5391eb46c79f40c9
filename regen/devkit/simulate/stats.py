"""Request counters of the simulator and its optional request log.

The request log (``--request-log FILE``) is JSONL, one line per request the server finished
handling, in the order they finished::

    {"t": 12.345, "key": "<request_key>", "conversation": "<conversation_key>", "attempt": 0,
     "status": 200, "fault": null | "fail" | "rate_limit" | "overload" | "queue_full" | ...,
     "stream": true, "prompt_tokens": 42, "completion_tokens": 300, "finish_reason": "stop"}

``fault`` is the fault drawn (regen.devkit.simulate.faults), ``queue_full`` for a request refused
by ``--max-queued-requests``, or ``overload_window`` for one refused by the scheduled 503 storm
(``--overload-at-s``). ``t`` is seconds since the server started; ``attempt`` counts
earlier requests with the same key. Lines of requests that did not complete (a fault, a 400
after parsing, a client that hung up: ``"client_gone": true``) carry only t, key,
conversation, attempt, status and fault; a hung-up client's ``status`` is what its response had
sent: 200 once a stream's headers were out, null when nothing was (a non-streamed answer, or a
stream before its first token). A request a hang held (``--hang-*``: it arrived during a hang,
or was under way when one began) has ``"hung": true``; it gets no line while it is held, and
``client_gone`` when its client gives up (or the server stops) before the hang ends. Bodies
that are not valid requests at all are counted in ``errors`` but not logged.
"""

from __future__ import annotations

import collections
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any


@dataclass(slots=True)
class RequestCounters:
    received: int = 0  #: chat completion requests received
    completed: int = 0  #: answered in full (stalled ones included)
    failed: collections.Counter[str] = field(default_factory=collections.Counter)  #: by fault
    stalled: int = 0  #: answers that paused (and then completed)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)  #: 400/404
    client_gone: int = 0  #: clients that hung up before the end
    queue_full: int = 0  #: refused with 503 by --max-queued-requests (not a fault draw)
    prompt_tokens: int = 0
    completion_tokens: int = 0  #: of completed answers
    first_request_at: float | None = None
    since: float = field(default_factory=time.monotonic)


class RequestStats:
    """Counters, per-key attempt counts and the request log of one server."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.started = time.monotonic()
        self.counters = RequestCounters()
        self.attempts: collections.Counter[str] = collections.Counter()
        self.conversations: collections.Counter[str] = collections.Counter()
        self._log: IO[str] | None = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = log_path.open("a", encoding="utf-8", buffering=1)

    def receive(self, key: str, conversation: str) -> int:
        """Count a request; returns its attempt number (0 for the first with this key)."""
        c = self.counters
        c.received += 1
        if c.first_request_at is None:
            c.first_request_at = time.monotonic()
        attempt = self.attempts[key]
        self.attempts[key] = attempt + 1
        self.conversations[conversation] += 1
        return attempt

    def record(self, **line: Any) -> None:
        if self._log is not None:
            line["t"] = round(time.monotonic() - self.started, 6)
            self._log.write(json.dumps(line, separators=(",", ":")) + "\n")

    def reset(self) -> None:
        """Zero the counters (attempt counts stay: they drive the fault draws)."""
        self.counters = RequestCounters()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
