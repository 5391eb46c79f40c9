"""`regen verify-server URL --draft DRAFT_DIR`: fail unless the server runs EAGLE3 with it."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from regen.cli._args import add_api_key_arguments, api_key_fields

NAME = "verify-server"
HELP = "check a running SGLang server really serves EAGLE3 with the given draft"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "url",
        metavar="URL",
        help="server URL, e.g. http://host:30000 (an OpenAI base ending in /v1 is accepted)",
    )
    parser.add_argument("--draft", required=True, help="the draft directory the server must use")
    parser.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout in seconds")
    add_api_key_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from regen.client import resolve_api_key, server_root
    from regen.manifest import Endpoint
    from regen.train.serving import LOW_ACCEPT_LENGTH, verify_server

    keys = api_key_fields(args)
    key = resolve_api_key(Endpoint(url=server_root(args.url), **keys)) if keys else None
    check = verify_server(args.url, args.draft, timeout=args.timeout, api_key=key)
    out = Console()
    out.print(
        f"[green]ok[/] {escape(check.url)}: {check.algorithm} with draft "
        f"{escape(check.draft_path)} (steps={check.num_steps}, topk={check.eagle_topk}, "
        f"draft_tokens={check.num_draft_tokens})",
        highlight=False,
        soft_wrap=True,
    )
    if check.avg_accept_length is not None:
        out.print(
            f"avg_spec_accept_length: {check.avg_accept_length:.3f}",
            highlight=False,
            soft_wrap=True,
        )
        if check.draft_not_helping:
            out.print(
                f"[yellow]warning: avg_spec_accept_length <= {LOW_ACCEPT_LENGTH}: the draft is "
                "not helping (check the EAGLE3 flags, the aux layer ids and the draft's data)[/]",
                highlight=False,
                soft_wrap=True,
            )
    else:
        out.print("avg_spec_accept_length: not reported yet", highlight=False, soft_wrap=True)
    return 0
