"""Entry point of the `regen` console script: finds the command modules and dispatches.

Exit codes, the same for `regen` and every `ray job submit` entrypoint (pipelines/), listed in
the README: :data:`EXIT_DONE` 0 (every sample done or permanently failed, and counted),
:data:`EXIT_FAILED` 1 (`regen verify` found damage, a training job failed, a bug's traceback),
:data:`EXIT_CONFIG` 2 (a regen error, such as a bad manifest or no usable endpoint at start:
one line on stderr), :data:`EXIT_LEFT` 75 (samples are left for the next run: run the same
command again; :class:`regen.core.errors.RunIncompleteError`, or transient failures left; sysexits'
EX_TEMPFAIL), :data:`EXIT_INTERRUPTED` 130 (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import logging
import os
import pkgutil
import sys
import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from types import ModuleType
from typing import NoReturn

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

import regen
import regen.cli
from regen.core.errors import RegenError, RunIncompleteError

log = logging.getLogger("regen")

EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_LEFT = 75
EXIT_INTERRUPTED = 130


#: the entry-point group of commands that live outside regen.cli (pyproject.toml)
COMMANDS_GROUP = "regen.commands"


def _commands() -> list[ModuleType]:
    """The command modules: regen.cli's own, and those other packages declare under the
    ``regen.commands`` entry points (the devkit's ``demo`` and ``simulate``), never imported
    by name here."""
    mods = []
    for info in pkgutil.iter_modules(regen.cli.__path__):
        if info.name.startswith("_") or info.name == "main":
            continue
        mods.append(importlib.import_module(f"regen.cli.{info.name}"))
    for ep in entry_points(group=COMMANDS_GROUP):
        mods.append(importlib.import_module(ep.value))
    mods = [m for m in mods if hasattr(m, "NAME") and hasattr(m, "run")]
    return sorted({m.NAME: m for m in mods}.values(), key=lambda m: m.NAME)


def command_in(argv: list[str]) -> str | None:
    """The command word ``argv`` names (its first word that is neither an option nor
    ``--log-level``'s value), or None."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word == "--log-level":
            skip = True
        elif not word.startswith("-"):
            return word
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; given ``only`` (a command's name), only that command's own
    arguments are built, the others listed by name and help alone: some are generated at
    build time (``regen simulate``'s, from its config models: ~0.2 CPU-s that every other
    command would pay)."""
    parser = argparse.ArgumentParser(
        prog="regen",
        description="Regenerate EAGLE-3 draft training data with the target model's own answers.",
    )
    parser.add_argument("--version", action="version", version=f"regen {regen.__version__}")
    parser.add_argument(
        "--log-level",
        default=os.environ.get("REGEN_LOG_LEVEL", "INFO"),
        help="logging level (default INFO, or $REGEN_LOG_LEVEL)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    commands = _commands()
    if only not in {mod.NAME for mod in commands}:
        only = None
    for mod in commands:
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        if only in (None, mod.NAME):
            mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def setup_logging(level: str) -> None:

    handler: logging.Handler
    if sys.stderr.isatty():
        handler = RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=False)
        fmt = "%(message)s"
    else:
        handler = logging.StreamHandler(sys.stderr)
        fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=level.upper(), format=fmt, handlers=[handler], force=True)


def report_error(e: RegenError) -> None:
    """One line on stderr, no traceback: how every regen entrypoint reports a regen error."""
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(str(e))}", highlight=False
    )


def invoke(run: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """Run a command on parsed arguments (``--log-level`` among them) as every regen entrypoint
    does: logging set up, a regen error one line on stderr and exit 2 (75 when it left samples
    for the next run), Ctrl-C exit 130 (the module docstring lists them)."""
    setup_logging(args.log_level)
    try:
        return int(run(args) or EXIT_DONE)
    except RunIncompleteError as e:
        report_error(e)
        return EXIT_LEFT
    except RegenError as e:
        report_error(e)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        Console(stderr=True).print("[yellow]interrupted[/]")
        return EXIT_INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(command_in(words)).parse_args(words)
    return invoke(args._run, args)


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` once Python's own shutdown has run: its threads joined,
    its atexit handlers (Ray's shutdown among them) called, logs and streams flushed. What is
    skipped is the C++ teardown of the native libraries loaded: under load one of their
    static destructors sometimes aborts the process after regen is done ("terminate called
    without an active exception", exit 134 where regen said 2; 7 of 90 exports beside a busy
    core), and an exit code must be regen's."""
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx does first
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def console() -> NoReturn:
    """The ``regen`` command (and ``python -m regen``)."""
    exit_now(main())


if __name__ == "__main__":
    console()
