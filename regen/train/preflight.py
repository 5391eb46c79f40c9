"""Preflight ON THE CLUSTER, then exec the trainer: ``python -m regen.train.preflight --run-dir D``.

This is the Ray job's entrypoint. Before a GPU is spent it:

1. plans ``train/run.yaml`` with SpecForge's own planner, as ``specforge train --plan`` does
   (``load_config``, ``resolve_run``, ``build_launch_plan``), here where the trainer starts, and
   records the plan (``train/specforge_plan.json``, ``where: cluster``);
2. re-checks every trap of the train config, against the target's own ``config.json`` when the
   checkpoint is readable here, and the run's tokenizer (``train/run_tokenizer.json``, recorded by
   ``regen train``) against the target's own tokenizer (regen.train.target);
3. scans the prompts file (loss masks, token ids), checks that the vocab mapping was built
   from exactly these rows and has the draft's shapes (regen.train.vocab), and runs the rows,
   in bounded chunks, through ``specforge.data.prompt_builder.prepare_prompt_tasks`` (the
   function SpecForge's producer uses), refusing data SpecForge would drop;
4. writes ``train/preflight.json`` and replaces itself with ``command.json``'s ``exec_argv``
   (``specforge train --config RUN_DIR/train/run.yaml``; an argv list, no shell).

Exit status 2 with ``preflight.json`` ``{ok: false, error, trap}`` when a check fails, and also
when anything else goes wrong (``error`` then starts with ``unexpected``): the record is always
written.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import tempfile
import time

from regen.client.server_info import fetch_server_info
from regen.core.errors import ConfigError, EndpointError, RegenError, TrapError
from regen.store import RunDir
from regen.store import layout as store_layout
from regen.train import traps
from regen.train.checks import check_target_files, check_train_config, turn_open_ids
from regen.train.config import load_train_config
from regen.train.specforge_config import plan_with_specforge
from regen.train.target import check_run_against_target, target_tokenizer
from regen.train.vocab import check_vocab_mapping

log = logging.getLogger(__name__)

#: rows per chunk handed to prepare_prompt_tasks (bounds the preflight's memory)
CHUNK_ROWS = 2000


def prompt_tasks(path: str | os.PathLike[str], *, max_length: int) -> list[object]:
    """SpecForge's own prompt builder over a pre-tokenized prompts file (``input_ids`` +
    ``loss_mask`` rows, every turn trained): the tasks its producer would train on."""
    from specforge.data.prompt_builder import prepare_prompt_tasks

    return list(
        prepare_prompt_tasks(
            path,
            None,
            chat_template=None,
            max_length=max_length,
            is_preformatted=False,
            train_only_last_turn=False,
            cache_dir=None,
            cache_key=None,
            num_proc=None,
        )
    )


def count_prepared(prompts_path: str, *, max_length: int, chunk_rows: int = CHUNK_ROWS) -> int:
    """How many rows SpecForge's prompt builder accepts, fed in chunks of ``chunk_rows``."""

    def run(lines: list[str]) -> int:
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.writelines(lines)
        try:
            return len(prompt_tasks(f.name, max_length=max_length))
        except ValueError as e:
            raise ConfigError(f"SpecForge's prompt builder refuses {prompts_path}: {e}") from None
        finally:
            os.unlink(f.name)

    accepted = 0
    chunk: list[str] = []
    with open(prompts_path, encoding="utf-8") as src:
        for line in src:
            if not line.strip():
                continue
            chunk.append(line if line.endswith("\n") else line + "\n")
            if len(chunk) >= chunk_rows:
                accepted += run(chunk)
                chunk = []
    if chunk:
        accepted += run(chunk)
    return accepted


def check_capture_servers(urls: list[str], *, timeout: float = 5.0) -> None:
    """Capture servers that report a speculative algorithm must report exactly EAGLE3.

    A server that is not reachable yet is only logged (SpecForge waits for it); one that
    reports ``EAGLE`` (or any other algorithm) would feed the draft the last layer only.
    """

    for url in urls:
        try:
            info = fetch_server_info(url, timeout=timeout)
        except EndpointError as e:
            log.warning("capture server %s not checked: %s", url, e)
            continue
        algo = info.get("speculative_algorithm")
        if algo is not None:
            traps.check_algorithm(algo, f"capture server {url} speculative_algorithm")
        method = info.get("spec_capture_method")
        if method is not None and str(method).lower() != "eagle3":
            raise TrapError(
                traps.TRAP_ALGORITHM,
                f"capture server {url} captures with method {method!r}, not eagle3.",
                "restart it with --spec-capture-method eagle3.",
            )


def preflight(run_dir: str) -> store_layout.PreflightRecord:
    """Every check; returns the preflight record (raises RegenError on a failed check)."""
    rd = RunDir.open(run_dir, create=False)
    command = store_layout.COMMAND_FILE.read(rd)
    if command is None:
        raise ConfigError(f"{rd.uri}: {store_layout.COMMAND} is missing; launch with `regen train`")
    try:
        from specforge.config import load_config
    except ImportError as e:
        raise ConfigError(f"SpecForge is not installed on this node: {e}") from None
    run_yaml = command.run_yaml
    plan = plan_with_specforge(run_yaml, where="cluster")
    store_layout.SPECFORGE_PLAN_FILE.write(rd, plan)
    run_cfg = load_config(run_yaml)

    cfg = load_train_config(rd.path(store_layout.TRAIN_YAML))
    check_train_config(cfg)
    check_target_files(cfg)
    check_run_against_target(store_layout.TOKENIZER_FILE.read(rd), target_tokenizer(cfg), cfg)

    check_capture_servers(cfg.capture.server_urls)

    prompts = run_cfg.data.prompts_path
    scan = traps.scan_prompts([prompts], turn_open_ids(cfg))
    traps.check_loss_masks(scan)
    traps.check_vocab(
        target_vocab=cfg.target.vocab_size,
        draft_vocab=cfg.draft.vocab_size,
        draft_vocab_size=cfg.draft.draft_vocab_size,
        max_token_id=scan.max_token_id,
    )
    check_vocab_mapping(rd, rows=scan.rows, loss_tokens=scan.loss_tokens)
    prepared = count_prepared(prompts, max_length=run_cfg.data.max_length)
    if prepared == 0:
        raise TrapError(
            traps.TRAP_EMPTY_LOSS_MASK,
            f"SpecForge's prompt builder keeps none of the {scan.rows} rows of {prompts} "
            f"(no trained token within data.max_length={run_cfg.data.max_length}).",
            "raise training.max_length or re-export the run.",
        )
    if prepared < scan.rows:
        log.warning("SpecForge keeps %d of %d rows (answers past max_length %d are cut)",
                    prepared, scan.rows, run_cfg.data.max_length)  # fmt: skip
    return store_layout.PreflightRecord(
        ok=True,
        host=socket.gethostname(),
        at=time.time(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        rows=scan.rows,
        prepared=prepared,
        loss_tokens=scan.loss_tokens,
        run_yaml=run_yaml,
        specforge_plan={"kind": plan.kind, "role": plan.role},
        argv=command.argv,
        exec_argv=command.exec_argv,
    )


def _record_failure(rd: RunDir, error: str, trap: str | None) -> None:
    record = store_layout.PreflightRecord(
        ok=False, host=socket.gethostname(), at=time.time(), error=error, trap=trap
    )
    store_layout.PREFLIGHT_FILE.write(rd, record)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m regen.train.preflight")
    parser.add_argument("--run-dir", required=True, help="the run directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rd = RunDir.open(args.run_dir, create=False)
    try:
        record = preflight(args.run_dir)
    except RegenError as e:
        _record_failure(rd, str(e), getattr(e, "trap", None))
        log.error("preflight failed: %s", e)
        return 2
    except Exception as e:  # a bug or an unforeseen input: still recorded, never lost
        log.exception("preflight crashed")
        _record_failure(rd, f"unexpected {type(e).__name__}: {e}", None)
        return 2
    store_layout.PREFLIGHT_FILE.write(rd, record)
    exec_argv = record.exec_argv
    log.info("preflight ok (%d rows); exec %s", record.rows, json.dumps(exec_argv))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(exec_argv[0], exec_argv)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
