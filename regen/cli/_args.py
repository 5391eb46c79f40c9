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


def add_api_key_arguments(p: argparse.ArgumentParser, what: str = "the server") -> None:
    """``--api-key-env NAME`` / ``--api-key-file PATH``: the key of a server started with
    SGLang's ``--api-key``, by the manifest's rules: never the key itself on the command line,
    never logged (it goes only into ``Authorization: Bearer``)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--api-key-env",
        metavar="NAME",
        help=f"environment variable holding the API key of {what} (never the key itself)",
    )
    g.add_argument(
        "--api-key-file",
        metavar="PATH",
        help=f"file holding the API key of {what} (never the key itself)",
    )


def api_key_fields(args: argparse.Namespace) -> dict[str, str]:
    """``api_key_env`` / ``api_key_file`` for :class:`regen.manifest.Endpoint` from the flags
    (a relative file is made absolute against the current directory)."""
    from pathlib import Path

    if getattr(args, "api_key_env", None):
        return {"api_key_env": args.api_key_env}
    if getattr(args, "api_key_file", None):
        return {"api_key_file": str(Path(args.api_key_file).expanduser().resolve())}
    return {}
