"""`regen export RUN_DIR --out DIR [--holdout N] [--drop-flags FLAGS] [--only-flagged]`: SpecForge
JSONL shards + stats.json (and the held-out prompts) from a run directory.

Defaults come from the ``export`` section of the run directory's manifest when it has one;
flags override them. A damaged run directory is refused (see ``regen verify``). Rows carrying a
quality flag of ``--drop-flags`` are dropped (docs/quality.md); ``--only-flagged`` writes just
those, for inspection.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from regen.store.layout import ExportStats

NAME = "export"
HELP = "write SpecForge pre-tokenized (or raw-conversation) JSONL shards and their stats"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """RUN_DIR, --out and one flag per export setting, its ``dest`` the name of the setting's
    field (regen.export.ExportSettings: :func:`run` hands the flags given to it by that name);
    a flag not given leaves the manifest's value. No model is imported here: ``regen --help``
    builds this parser."""
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory (path or pyarrow URI)")
    parser.add_argument("--out", required=True, help="output directory (path or pyarrow URI)")
    _add_row_flags(parser)
    _add_output_flags(parser)


def _add_row_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the settings that decide which rows are written."""
    trunc = parser.add_mutually_exclusive_group()
    trunc.add_argument(
        "--drop-truncated",
        dest="drop_truncated",
        action="store_true",
        default=None,
        help="drop rows whose finish_reason is 'length' (default)",
    )
    trunc.add_argument(
        "--keep-truncated", dest="drop_truncated", action="store_false", help="keep them"
    )
    parser.add_argument(
        "--max-length", type=int, default=None, help="drop rows longer than N tokens"
    )
    parser.add_argument(
        "--drop-flags",
        metavar="FLAGS",
        default=None,
        help="drop rows carrying any of these quality flags: comma list of repetition, "
        "empty_content, reasoning_unclosed, language_mismatch, refusal, bad_tool_call, "
        "collapsed (one answer to many prompts of a source, found here); or default, all, "
        "none (manifest export.drop_flags; default: all but refusal)",
    )
    parser.add_argument(
        "--keep-unproven",
        action="store_true",
        default=None,
        help="keep locally rendered rows whose token check cannot show they are the model's "
        "tokens (manifest export.keep_unproven; by default they are dropped: docs/format.md)",
    )
    parser.add_argument(
        "--holdout",
        type=int,
        default=None,
        metavar="N",
        help="keep N samples per source out of the shards, chosen by the seed, and write their "
        "prompts beside the shards for `regen bench --run` (manifest: 0)",
    )
    parser.add_argument(
        "--setting",
        default=None,
        metavar="ID",
        help="keep only the rows made with this settings id (and native rows): a run continued "
        "with `regen run --force` mixes settings; `regen status` shows each id's samples",
    )


def _add_output_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the settings that decide how the rows are written."""
    parser.add_argument("--seed", type=int, default=None, help="shuffle seed (manifest: 0)")
    parser.add_argument(
        "--shard-rows",
        type=int,
        default=None,
        help="rows per shard (manifest: 10000; 0 = one shard, what SpecForge's prompts_path reads)",
    )
    parser.add_argument(
        "--only-flagged",
        action="store_true",
        help="write only the rows --drop-flags would drop (one record per row with its turn, "
        "attempt and flags in the conversations format), for inspection",
    )
    parser.add_argument(
        "--format",
        choices=("pretokenized", "conversations"),
        default="pretokenized",
        help="pretokenized {input_ids, loss_mask} (default) or raw conversations",
    )


def run(args: argparse.Namespace) -> int:
    from monitor.render import make_console
    from regen.export import ExportSettings, export_run
    from regen.store import RunDir

    rd = RunDir.open(args.run_dir, create=False).require()
    given = {k: v for k, v in vars(args).items() if k in ExportSettings.model_fields}
    stats = export_run(rd, args.out, ExportSettings.of_run(rd, **given))
    console = make_console()
    print_export(console, stats, f"export {args.run_dir} → {args.out} ({stats.format})")
    return 0


def print_export(console: Console, stats: ExportStats, title: str) -> None:
    """The per-source table (rows read, written, tokens, mask, dropped per reason) and the
    summary lines of an export (regen.store.layout.ExportStats, as written or read back)."""
    console.print(escape(title), highlight=False, soft_wrap=True)  # a path: never wrapped
    table = Table()
    for col in ("source", "read", "written", "tokens", "loss tokens", "mask", "dropped"):
        table.add_column(col, justify="left" if col in ("source", "dropped") else "right")
    for name, s in stats.sources.items():
        dropped = ", ".join(f"{k} {v}" for k, v in sorted(s.dropped.items())) or "-"
        table.add_row(
            escape(name),
            f"{s.rows_read:,}",
            f"{s.rows:,}",
            f"{s.tokens:,}",
            f"{s.loss_tokens:,}",
            f"{s.mask_coverage:.1%}",
            escape(dropped),
        )
    console.print(table)
    if stats.flags:
        what = "written" if stats.only_flagged else "dropped"
        flags = ", ".join(
            f"{k} {v.rows:,} rows / {v.tokens:,} tokens" for k, v in stats.flags.items()
        )
        console.print(f"quality flags {what}: {escape(flags)}", highlight=False)
    checks = ", ".join(f"{k} {v}" for k, v in sorted(stats.token_check.items())) or "none"
    console.print(
        f"{stats.rows_written:,} rows, {stats.tokens:,} tokens in {len(stats.shards)} shard(s); "
        f"token check: {escape(checks)}",
        highlight=False,
    )
    made = {k: v for k, v in stats.settings.items() if k not in ("native", "unknown")}
    if len(made) > 1 or stats.setting is not None:
        mix = ", ".join(f"{k} {v:,} rows" for k, v in sorted(stats.settings.items()))
        kept = f" (--setting {stats.setting})" if stats.setting else ""
        console.print(f"rows per setting{kept}: {escape(mix)}", highlight=False)
    if stats.holdout_file:
        console.print(
            f"{stats.holdout_samples:,} samples held out ({stats.holdout} per source at most): "
            f"prompts in {escape(stats.out)}/{stats.holdout_file} for `regen bench --run`",
            highlight=False,
        )
    print_export_warnings(console, stats)


def print_export_warnings(console: Console, stats: ExportStats) -> None:
    """The export's warnings: rows that failed the token check, rows dropped as unproven."""
    mismatches = stats.token_check_problems
    if mismatches:
        console.print(
            f"[yellow]{mismatches} row(s) failed the token check: the local render disagreed "
            "with the server ids (server ids kept) or with the server's token count, or the "
            "response needed a guessed close of its reasoning (see docs/format.md)[/]"
        )
    unproven = dict(stats.dropped).get("unproven_tokens", 0)
    if unproven:
        console.print(
            f"[yellow]{unproven} locally rendered row(s) dropped as unproven_tokens: their "
            "token check cannot show they are the model's tokens (export.keep_unproven or "
            "--keep-unproven keeps them)[/]"
        )
    elif getattr(stats, "keep_unproven", False):
        console.print("[yellow]rows whose tokens are unproven were kept (keep_unproven)[/]")
