"""Arguments several commands share (not a command: its name starts with an underscore)."""

from __future__ import annotations

import argparse


def add_override_argument(p: argparse.ArgumentParser) -> None:
    """``-o key.sub=value`` or ``-o FILE.yaml`` (repeatable): dotted manifest overrides or an
    overlay file, validated like the manifest itself."""
    p.add_argument(
        "-o",
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE|FILE",
        help="dotted manifest override, e.g. -o sources.sharegpt.limit=3, or an overlay YAML "
        "file such as regen plan --reweight writes (repeatable)",
    )
