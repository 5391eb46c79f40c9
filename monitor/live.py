"""The refreshing view of a run: `regen monitor`, and the view `regen run` shows in its terminal.

Each tick reads the progress file, the lock and run.json (through
:class:`regen.status.RunView`), computes the numbers and redraws; every
``regen.status.RECONCILE_EVERY_S`` it also lists parts/ (never opening a Parquet file) to
notice parts that vanished. The cost does not depend on the size of the run. A tick that
fails to read (a file being replaced on a slow filesystem, a network hiccup) keeps the last good
frame and shows the error under it. When the console is not a terminal the same numbers are
logged as one plain line per ``log_every_s`` instead (:func:`monitor.plain.log_line`).
"""

from __future__ import annotations

import logging
import os
import threading

from rich.console import Console, RenderableType
from rich.live import Live
from rich.text import Text

from monitor.plain import log_line
from monitor.render import frame, make_console
from regen.core.errors import RegenError
from regen.status import STALL_AFTER_S, RunNumbers, RunView
from regen.store.rundir import RunDir

log = logging.getLogger(__name__)


class Ticker:
    """Reads and renders one tick at a time; remembers the last good numbers."""

    def __init__(
        self, run_dir: RunDir | str | os.PathLike[str], *, stall_after_s: float = STALL_AFTER_S
    ):
        #: what is read: the handle its command opened, or a path opened at the first tick
        self.target = run_dir
        self.run_dir = run_dir.uri if isinstance(run_dir, RunDir) else os.fspath(run_dir)
        self.stall_after_s = stall_after_s
        self.view: RunView | None = None
        self.last: RunNumbers | None = None
        self.error = ""

    def tick(self, now: float | None = None) -> RunNumbers | None:
        """Refresh the numbers; on a read error keep the previous ones and remember the error."""
        try:
            if self.view is None:
                self.view = RunView(self.target)
            self.last = self.view.numbers(now, stall_after_s=self.stall_after_s)
            self.error = ""
        except (RegenError, OSError) as e:
            self.error = f"cannot read {self.run_dir}: {e}"
            log.debug("%s", self.error)
        return self.last

    def renderable(self, width: int) -> RenderableType:
        if self.last is None:
            why = f" ({self.error})" if self.error else ""
            return Text(f"waiting for {self.run_dir} ...{why}", style="yellow")
        note = f"{self.error} (showing the last good read)" if self.error else ""
        return frame(self.last, width=width, note=note)


def watch(
    run_dir: str | os.PathLike[str],
    *,
    refresh_s: float = 2.0,
    console: Console | None = None,
    stop_event: threading.Event | None = None,
    stall_after_s: float = STALL_AFTER_S,
    log_every_s: float = 60.0,
) -> RunNumbers | None:
    """Show the run until ``stop_event`` is set (or Ctrl-C); returns the last numbers.

    On a terminal: a rich Live dashboard redrawn every ``refresh_s``. Otherwise: one plain log
    line every ``log_every_s`` (and one at the end).
    """
    console = console or make_console()
    stop = stop_event or threading.Event()
    ticker = Ticker(run_dir, stall_after_s=stall_after_s)
    if not console.is_terminal:
        _log_tick(ticker)
        while not stop.wait(log_every_s):
            _log_tick(ticker)
        _log_tick(ticker)  # the final state
        return ticker.last
    ticker.tick()
    with Live(
        ticker.renderable(console.width),
        console=console,
        auto_refresh=False,
        redirect_stdout=True,
        redirect_stderr=True,
    ) as live:
        try:
            while not stop.wait(refresh_s):
                ticker.tick()
                live.update(ticker.renderable(console.width), refresh=True)
        except KeyboardInterrupt:
            pass
        ticker.tick()
        live.update(ticker.renderable(console.width), refresh=True)
    return ticker.last


def _log_tick(ticker: Ticker) -> None:
    had = ticker.last is not None
    n = ticker.tick()
    if ticker.error:
        # before the first good read the directory may simply not exist yet (regen run)
        log.log(logging.WARNING if had else logging.DEBUG, "%s", ticker.error)
    elif n is not None:
        log.info("%s", log_line(n))


def run_in_thread(
    run_dir: RunDir | str | os.PathLike[str],
    stop_event: threading.Event,
    *,
    refresh_s: float = 2.0,
    console: Console | None = None,
    log_every_s: float = 60.0,
    started: threading.Event | None = None,
) -> threading.Thread:
    """Start :func:`watch` in a daemon thread (what `regen run` calls); set ``stop_event`` and
    join the thread to draw the final frame (or log the final line). With ``started``, the view
    waits for it (the session's first progress write): a session stopped before (a
    configuration error) shows nothing, never an earlier session's numbers."""

    def target() -> None:
        while started is not None and not started.wait(0.1):
            if stop_event.is_set():
                return
        try:
            watch(run_dir, refresh_s=refresh_s, console=console, stop_event=stop_event,
                  log_every_s=log_every_s)  # fmt: skip
        except Exception:  # the view must never take the run down
            log.exception("the progress view stopped")

    t = threading.Thread(target=target, name="regen-monitor", daemon=True)
    t.start()
    return t
