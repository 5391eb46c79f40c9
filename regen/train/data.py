"""The training data of a run directory: its export (made when needed) and the prompts file.

The files (``RUN_DIR`` must be a local or shared-filesystem path: the cluster reads it) are
named and typed in :mod:`regen.store.layout`: ``export/`` (shards + stats, written by
regen.export.export_run when missing, stale or forced: a Parquet part newer than the export's
stats means stale; it holds out as many samples as the export it replaces, else the run
manifest's ``export.holdout``, and ``holdout.jsonl`` is never a shard) and ``train/``
(train.yaml, draft_config.json, run.yaml, prompts.jsonl when the export has several shards,
command.json, job.json, preflight.json written ON THE CLUSTER by regen.train.preflight,
control/ for SpecForge). The names below are the layout's, under the names the training
modules use.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from regen.errors import ConfigError, RunDirError
from regen.store import RunDir
from regen.store import layout as L
from regen.store.run import read_manifest_data
from regen.train.config import TrainConfig

log = logging.getLogger(__name__)

TRAIN_DIR = L.TRAIN_DIR
TRAIN_YAML = L.TRAIN_YAML
DRAFT_CONFIG = L.DRAFT_CONFIG
RUN_YAML = L.RUN_YAML
PROMPTS = L.PROMPTS
COMMAND = L.COMMAND
JOB = L.JOB
PREFLIGHT = L.PREFLIGHT
CONTROL_DIR = L.CONTROL_DIR
EXPORT_DIR = L.EXPORT_DIR
EXPORT_STATS = L.EXPORT_STATS


def open_local(run_dir: str | Path) -> RunDir:
    """Open a run directory the training cluster can read by path (the entry points' one
    opening: the RunDir is passed on from here)."""
    rd = RunDir.open(run_dir, create=False)
    if not rd.is_local:
        raise RunDirError(
            f"{rd.uri}: training needs the run directory on a local or shared filesystem "
            "path (SpecForge reads it by path); copy it there first"
        )
    if not rd.exists(""):
        raise RunDirError(f"run directory {rd.uri} does not exist")
    return rd


def export_dir(rd: RunDir, cfg: TrainConfig) -> Path:
    return Path(cfg.export.dir) if cfg.export.dir else Path(rd.path(EXPORT_DIR))


def export_shards(out: Path) -> list[Path]:
    """The pre-tokenized JSONL shards of an export (``shard-*.jsonl``), in name order."""
    if not out.is_dir():
        return []
    return sorted(p for p in out.iterdir() if L.is_shard("pretokenized", p.name))


def export_is_stale(rd: RunDir, out: Path) -> bool:
    """True when the run has a Parquet part newer than the export's stats.json (or the export
    has no stats.json at all while the run has parts). Shards without parts are kept as given.
    """
    parts = Path(rd.path(L.PARTS_DIR))
    newest = max((p.stat().st_mtime for p in parts.glob(f"*{L.PART_SUFFIX}")
                  if not p.name.startswith(L.TMP_PREFIX)), default=None)  # fmt: skip
    if newest is None:
        return False
    stats = out / EXPORT_STATS
    return not stats.exists() or newest > stats.stat().st_mtime


def default_holdout(rd: RunDir, out: Path) -> int:
    """Samples per source an export by ``regen train`` holds out when its config does not say:
    as many as the export in ``out`` did (a re-export never trains on the bench's prompts),
    else the run manifest's ``export.holdout``, else 0."""
    try:
        record = L.EXPORT_STATS_FILE.read(RunDir.open(str(out), create=False))
    except RunDirError as e:
        log.warning("%s: %s; taking the holdout from the manifest", out, e)
        record = None
    if record is not None:
        return record.holdout
    try:
        data = read_manifest_data(rd) or {}
    except RunDirError:
        return 0
    export = data.get("export")
    value = export.get("holdout") if isinstance(export, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def ensure_export(rd: RunDir, cfg: TrainConfig) -> list[Path]:
    """The export's shards; exports the run first when it has none, is stale, or is forced.
    The caller has run the damage check on ``rd`` (regen.store.verify.refuse_damaged).

    The export drops (never cuts) rows longer than ``export.max_length`` (default
    ``training.max_length``).
    """
    out = export_dir(rd, cfg)
    shards = export_shards(out)
    if shards and not cfg.export.force and not export_is_stale(rd, out):
        log.info("using the existing export %s (%d shards)", out, len(shards))
        return shards
    try:
        from regen.export import export_run
    except ImportError as e:
        raise ConfigError(f"{out} holds no export and regen.export is unavailable: {e}") from None
    options = cfg.export.export_kwargs(cfg.training.max_length, default_holdout(rd, out))
    log.info("exporting %s to %s (%s)", rd.uri, out, options)
    export_run(rd, str(out), check=False, **options)
    shards = export_shards(out)
    if not shards:
        raise ConfigError(f"the export of {rd.uri} wrote no JSONL shards into {out}")
    return shards


def prompts_file(rd: RunDir, shards: list[Path]) -> Path:
    """One JSONL file for SpecForge's data.prompts_path (it takes exactly one)."""
    if len(shards) == 1:
        return shards[0]
    with rd.atomic_writer(PROMPTS) as w:
        for shard in shards:
            with shard.open("rb") as r:
                shutil.copyfileobj(r, w)
            if shard.stat().st_size and not _ends_with_newline(shard):
                w.write(b"\n")
    return Path(rd.path(PROMPTS))


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"
