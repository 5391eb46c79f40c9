"""Arguments several commands share (not a command: its name starts with an underscore)."""

from __future__ import annotations

import argparse


def add_override_argument(p: argparse.ArgumentParser) -> None:
    """``-o key.sub=value`` (repeatable): dotted manifest overrides, validated like the file."""
    p.add_argument(
        "-o",
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted manifest override, e.g. -o sources.sharegpt.limit=3 (repeatable)",
    )
