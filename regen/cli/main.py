"""Entry point of the `regen` console script: finds the command modules and dispatches."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Callable
from types import ModuleType

from rich.console import Console
from rich.markup import escape

import regen
import regen.cli
from regen.errors import RegenError

log = logging.getLogger("regen")


def _commands() -> list[ModuleType]:
    mods = []
    for info in pkgutil.iter_modules(regen.cli.__path__):
        if info.name.startswith("_") or info.name == "main":
            continue
        mod = importlib.import_module(f"regen.cli.{info.name}")
        if hasattr(mod, "NAME") and hasattr(mod, "run"):
            mods.append(mod)
    return sorted(mods, key=lambda m: m.NAME)


def build_parser() -> argparse.ArgumentParser:
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
    for mod in _commands():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def setup_logging(level: str) -> None:
    from rich.logging import RichHandler

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
    does: logging set up, a regen error one line on stderr and exit 2, Ctrl-C exit 130."""
    setup_logging(args.log_level)
    try:
        return int(run(args) or 0)
    except RegenError as e:
        report_error(e)
        return 2
    except KeyboardInterrupt:
        Console(stderr=True).print("[yellow]interrupted[/]")
        return 130


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return invoke(args._run, args)


if __name__ == "__main__":
    sys.exit(main())
