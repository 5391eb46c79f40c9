"""The training data of a run directory: its export (made when needed) and the prompts file.

The files (``RUN_DIR`` must be a local or shared-filesystem path: the cluster reads it) are
named and typed in :mod:`regen.store.layout`: ``export/`` (shards + stats, written by
regen.export.export_run with exactly ``regen export``'s settings, the run manifest's
``export:`` section, then train.yaml's ``export:`` overrides; rewritten when missing, stale (a
Parquet part newer than its stats), made with other row-deciding settings, or forced; it holds
out as many samples as the export it replaces, else the run manifest's ``export.holdout``, and
``holdout.jsonl`` is never a shard) and ``train/``
(train.yaml, draft_config.json, run.yaml, prompts.jsonl when the export has several shards,
vocab_mapping.pt + vocab_mapping.json (regen.train.vocab), run_tokenizer.json (regen.train.target),
specforge_plan.json, command.json, job.json, preflight.json written ON THE CLUSTER by
regen.train.preflight, control/attempt-NNN/ for SpecForge: a fresh one per launch once
SpecForge has written into the last).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from regen.core.errors import ConfigError, RunDirError
from regen.export import ExportSettings, export_run
from regen.export.select import check_drop_share
from regen.manifest import Manifest
from regen.store import RunDir
from regen.store import layout as L
from regen.store.layout import ExportStats
from regen.store.rundir import TMP_PREFIX
from regen.train.config import TrainConfig

log = logging.getLogger(__name__)


def open_local(run_dir: RunDir | str | Path) -> RunDir:
    """Open a run directory the training cluster can read by path (the entry points' one
    opening: the RunDir is passed on from here), or check that the handle a command opened
    is one."""
    rd = run_dir if isinstance(run_dir, RunDir) else RunDir.open(run_dir, create=False)
    if not rd.is_local:
        raise RunDirError(
            f"{rd.uri}: training needs the run directory on a local or shared filesystem "
            "path (SpecForge reads it by path); copy it there first"
        )
    return rd.require()


def control_dir(rd: RunDir) -> str:
    """SpecForge's control directory for this launch: the last attempt's while SpecForge has
    written nothing into it, else a new one (its planner refuses a used consumer database)."""
    base = Path(rd.path(L.CONTROL_DIR))
    attempts = sorted(base.glob(L.CONTROL_ATTEMPT_GLOB)) if base.is_dir() else []
    if attempts and not any(attempts[-1].iterdir()):
        return str(attempts[-1])
    return rd.path(L.control_attempt(len(attempts) + 1))


def export_dir(rd: RunDir, cfg: TrainConfig) -> Path:
    return Path(cfg.export.dir) if cfg.export.dir else Path(rd.path(L.EXPORT_DIR))


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
                  if not p.name.startswith(TMP_PREFIX)), default=None)  # fmt: skip
    if newest is None:
        return False
    stats = out / L.EXPORT_STATS
    return not stats.exists() or newest > stats.stat().st_mtime


def read_export_stats(out: Path) -> ExportStats | None:
    """The stats of the export in ``out`` (None when it has no readable stats.json)."""
    try:
        return L.EXPORT_STATS_FILE.read(RunDir.open(str(out), create=False))
    except RunDirError as e:
        log.warning("%s: %s", out, e)
        return None


def default_holdout(base: ExportSettings, previous: ExportStats | None) -> int:
    """Samples per source an export by ``regen train`` holds out when its config does not say:
    as many as the ``previous`` export did (a re-export never trains on the bench's prompts),
    else the run manifest's ``export.holdout`` (``base``: :meth:`ExportSettings.of_run`)."""
    return previous.holdout if previous is not None else base.holdout


@dataclass(slots=True)
class TrainExport:
    """The export a training run reads, and whether this launch wrote it."""

    dir: Path
    shards: list[Path]
    #: its stats (None: shards given without a stats.json, used as they are)
    stats: ExportStats | None
    #: why it was written now ("" when an up-to-date export was reused)
    reason: str


def export_options(
    rd: RunDir, cfg: TrainConfig, previous: ExportStats | None, manifest: Manifest | None = None
) -> ExportSettings:
    """The settings of ``regen export RUN_DIR`` (the manifest's export section) with those the
    train config sets (regen.train.config.ExportSpec), as a pretokenized export: its holdout,
    unless the config says, the one of the export being replaced (``previous``, its stats), and
    its max_length :meth:`TrainConfig.export_max_length`'s. ``manifest``: the run's, when the
    caller has read it."""
    base = ExportSettings.of_run(rd, manifest)
    return base.overridden(**{
        "holdout": default_holdout(base, previous),
        **cfg.export.given(),
        "max_length": cfg.export_max_length(base.max_length),
    })  # fmt: skip


def ensure_export(
    rd: RunDir, cfg: TrainConfig, manifest: Manifest | None = None, *, allow_drops: bool = False
) -> TrainExport:
    """The export's shards, exported first when missing, stale, made with other settings, or
    forced. Refuses (ConfigError) an export that drops more than ``export.max_drop_share`` of
    the rows it could train on, unless ``allow_drops``: a new one before it writes anything.
    The caller has run the damage check on ``rd`` (regen.store.verify.refuse_damaged).
    """
    out = export_dir(rd, cfg)
    stats = read_export_stats(out)
    settings = export_options(rd, cfg, stats, manifest)
    max_share = None if allow_drops else cfg.export.max_drop_share
    shards = export_shards(out)
    reason = ""
    if not shards:
        reason = "there is no export yet"
    elif cfg.export.force:
        reason = "export.force is set"
    elif export_is_stale(rd, out):
        reason = "the run has parts newer than the export"
    elif stats is not None:
        differ = settings.row_difference(stats)
        reason = f"the export's settings differ ({differ})" if differ else ""
    if not reason:
        log.info("using the existing export %s (%d shards)", out, len(shards))
        if stats is not None and max_share is not None:
            check_drop_share(stats, max_share)
        return TrainExport(out, shards, stats, "")
    log.info("exporting %s to %s: %s (%s)", rd.uri, out, reason, settings)
    settings = settings.model_copy(update={"max_drop_share": max_share})
    stats = export_run(rd, str(out), settings, check=False)
    shards = export_shards(out)
    if not shards:
        raise ConfigError(f"the export of {rd.uri} wrote no JSONL shards into {out}")
    return TrainExport(out, shards, stats, reason)


def prompts_file(rd: RunDir, shards: list[Path]) -> Path:
    """One JSONL file for SpecForge's data.prompts_path (it takes exactly one)."""
    if len(shards) == 1:
        return shards[0]
    with rd.atomic_writer(L.PROMPTS) as w:
        for shard in shards:
            with shard.open("rb") as r:
                shutil.copyfileobj(r, w)
            if shard.stat().st_size and not _ends_with_newline(shard):
                w.write(b"\n")
    return Path(rd.path(L.PROMPTS))


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"
