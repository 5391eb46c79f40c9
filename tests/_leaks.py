"""No leaks: a test that leaves a file, a socket, a subprocess or an aiohttp session or
connector open fails (registered by tests/conftest.py; pyproject.toml's ``filterwarnings``
holds the two warning filters below).

A leak surfaces in one of three ways, each a failure:

- **a ResourceWarning**, raised by the finaliser of the object left open (an unclosed file,
  socket or ``subprocess.Popen``; aiohttp's "Unclosed client session" and "Unclosed
  connector"). ``error::ResourceWarning`` makes it an exception; raised in a finaliser, Python
  hands it to ``sys.unraisablehook`` and pytest reports it as a
  ``PytestUnraisableExceptionWarning`` at the next phase of the test running then, which the
  second filter makes an error when it carries a ResourceWarning (other unraisable exceptions
  stay warnings).
- **aiohttp's log record**: when the warning is not an error (a test that silences warnings),
  aiohttp logs "Unclosed client session" (connector, connection, response) through asyncio's
  exception handler instead. :func:`nothing_logged_unclosed` fails the test in whose time
  such a record is logged.
- **at the end**: an object in a reference cycle is finalised only by the garbage collector.
  :func:`collected_at_the_end` collects once as the session's last test tears down, so a leak
  found there fails that test rather than printing after the run (an xdist worker's own exit
  status is lost).

A leak found when its object is finalised lands on the test running then: the message names
the object, and ``PYTHONTRACEMALLOC=20`` adds where it was made. Third-party warnings raised
in other processes (Ray's, moto's, vLLM's) never reach these filters.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator

import pytest

#: what aiohttp logs (asyncio's exception handler, logger ``asyncio``) for an object it finds
#: open when it is finalised
UNCLOSED = ("Unclosed client session", "Unclosed connector", "Unclosed connection",
            "Unclosed response")  # fmt: skip


class UnclosedRecords(logging.Handler):
    """Keeps the first line of every ``asyncio`` record that reports an unclosed object."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(UNCLOSED):
            self.seen.append(message.replace("\n", " "))


RECORDS = UnclosedRecords()


def pytest_configure(config: pytest.Config) -> None:
    logging.getLogger("asyncio").addHandler(RECORDS)


def pytest_unconfigure(config: pytest.Config) -> None:
    logging.getLogger("asyncio").removeHandler(RECORDS)


@pytest.fixture(autouse=True)
def nothing_logged_unclosed() -> Iterator[None]:
    """The test fails when aiohttp logged an unclosed session or connector in its time."""
    before = len(RECORDS.seen)
    yield
    new = RECORDS.seen[before:]
    if new:
        pytest.fail("left open (aiohttp, at garbage collection):\n" + "\n".join(new))


@pytest.fixture(autouse=True, scope="session")
def collected_at_the_end() -> Iterator[None]:
    """One garbage collection as the session's last test tears down: what a reference cycle
    kept unfinalised is found there (pytest reports its unraisable ResourceWarning right
    after this teardown)."""
    yield
    before = len(RECORDS.seen)
    gc.collect()
    new = RECORDS.seen[before:]
    if new:
        pytest.fail("left open (aiohttp, found at the end):\n" + "\n".join(new))
