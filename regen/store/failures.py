"""Failures: why samples could not be completed.

Files (names and records in :mod:`regen.store.layout`)::

    failures/SESSION.jsonl   one FailureRecord per line, appended as samples fail (on an object
                             store, which cannot append, the session's file is rewritten);
                             the latest record of a sample wins

Permanent failures are skipped on resume unless ``--retry-failed``; transient ones are
requested again by the next run.
"""

from __future__ import annotations

import logging
from typing import IO

from pydantic import ValidationError

from regen.core.errors import RunDirError
from regen.store import layout
from regen.store.layout import FailureRecord
from regen.store.rundir import RunDir

__all__ = ["FailureLog", "FailureRecord", "read_failures"]

log = logging.getLogger(__name__)


class FailureLog:
    """Appends failure records of one session to failures/SESSION.jsonl."""

    def __init__(self, rd: RunDir, session: str) -> None:
        self.rd = rd
        self.rel = layout.failures_path(session)
        self._stream: IO[bytes] | None = None
        self._lines: list[bytes] = []

    def append(self, rec: FailureRecord) -> None:
        line = rec.model_dump_json().encode() + b"\n"
        try:
            if self.rd.is_object_store:  # no append there: rewrite the session's file
                self._lines.append(line)
                self.rd.write_bytes_atomic(self.rel, b"".join(self._lines))
                return
            if self._stream is None:
                self.rd.makedirs(layout.FAILURES_DIR)
                self._stream = self.rd.fs.open_output_stream(self.rd.path(self.rel))
            self._stream.write(line)
            self._stream.flush()
        except OSError as e:
            raise RunDirError(f"{self.rd.uri}: cannot append to {self.rel}: {e}") from e

    def close(self) -> None:
        if self._stream is not None:
            try:
                self._stream.close()
            except OSError as e:  # a record cut by a full disk is skipped when read
                log.warning("closing %s: %s", self.rel, e)
            self._stream = None


def read_failures(rd: RunDir) -> dict[str, FailureRecord]:
    """The latest failure record of every sample (sessions in name order = time order)."""
    out: dict[str, FailureRecord] = {}
    for name in rd.list(layout.FAILURES_DIR):
        if not layout.is_failures_log(name):
            continue
        data = rd.read_bytes(f"{layout.FAILURES_DIR}/{name}") or b""
        for raw in data.split(b"\n"):
            if not raw.strip():
                continue
            try:
                rec = FailureRecord.model_validate_json(raw)
            except ValidationError:
                continue
            prev = out.get(rec.sample_id)
            if prev is None or rec.at >= prev.at:
                out[rec.sample_id] = rec
    return out
