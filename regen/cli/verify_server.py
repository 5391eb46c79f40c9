"""`regen verify-server URL --draft DRAFT_DIR`: fail unless the server runs EAGLE3 with it.

SGLang: its ``/server_info`` (algorithm, draft path, tuning, running acceptance). vLLM: what it
exposes (``/metrics`` counters, dev-mode config) and the draft's own config (its aux-layer
numbering); what vLLM does not show is printed as unchecked (regen.serve.vllm)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from regen.cli._args import add_api_key_arguments, api_key_fields

NAME = "verify-server"
HELP = "check a running SGLang or vLLM server really serves EAGLE3 with the given draft"


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
    from monitor.render import make_console
    from regen.client import resolve_api_key, server_root
    from regen.manifest import Endpoint
    from regen.serve.sglang import LOW_ACCEPT_LENGTH, verify_any
    from regen.serve.vllm import VllmCheck

    keys = api_key_fields(args)
    key = resolve_api_key(Endpoint(url=server_root(args.url), **keys)) if keys else None
    check = verify_any(args.url, args.draft, timeout=args.timeout, api_key=key)
    out = make_console()
    if isinstance(check, VllmCheck):
        return _print_vllm(out, check, LOW_ACCEPT_LENGTH)
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


def _print_vllm(out: Console, check: object, low: float) -> int:
    from regen.serve.vllm import VllmCheck

    assert isinstance(check, VllmCheck)
    draft = check.draft
    ids = f", aux layers {draft.vllm_ids} (trained on {draft.specforge_ids})" if draft else ""
    out.print(
        f"[green]ok[/] {escape(check.url)}: vLLM {escape(str(check.version))} speculating "
        f"({escape(check.method or 'method not shown')}, "
        f"{check.num_speculative_tokens} draft tokens){escape(ids)}",
        highlight=False,
        soft_wrap=True,
    )
    c = check.counters
    accept = check.avg_accept_length
    per_pos = ", ".join(f"{p}: {n / c.drafts:.3f}" for p, n in c.per_position.items()) if (
        c.drafts) else ""  # fmt: skip
    out.print(
        f"acceptance length: {accept:.3f} over {c.drafts:.0f} drafts"
        + (f" (accepted per position {per_pos})" if per_pos else "")
        if accept is not None
        else "acceptance length: not reported yet (no draft verified)",
        highlight=False,
        soft_wrap=True,
    )
    if accept is not None and accept <= low:
        out.print(
            f"[yellow]warning: acceptance length <= {low}: the draft is not helping (check the "
            "method is eagle3, the aux layer numbering and the draft's data)[/]",
            highlight=False,
            soft_wrap=True,
        )
    for what in check.unchecked:
        out.print(f"unchecked: {escape(what)}", highlight=False, soft_wrap=True)
    return 0
