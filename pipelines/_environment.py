"""What an entrypoint says when the Python that runs it lacks regen's dependencies (the head's
``python`` is not regen's environment): one line on stderr and exit 2, never a traceback.
Standard library only: it must work exactly where the rest cannot be imported."""

from __future__ import annotations

import sys
from typing import NoReturn

#: the exit code of a configuration error (regen.cli.main.EXIT_CONFIG; not imported: it is the
#: import that failed)
EXIT_CONFIG = 2


def missing_environment(error: ModuleNotFoundError, prog: str) -> int:
    """Report ``error`` (an import of regen's dependencies failed) in one line; returns 2."""
    sys.stderr.write(
        f"error: {prog}: {sys.executable} is not regen's environment ({error}): run the job "
        "with the Python regen is installed in, on the head and on every worker (an image or "
        "venv with `pip install .` started with its own `ray start`, or Ray's runtime_env; "
        "README 'On a cluster')\n"
    )
    return EXIT_CONFIG


def exit_with(code: int) -> NoReturn:
    """End an entrypoint with ``code``: through regen's own exit (regen.cli.main.exit_now)
    when regen's environment is there, else as Python does (nothing native was loaded)."""
    try:
        from regen.cli.main import exit_now
    except ImportError:
        sys.exit(code)
    exit_now(code)
