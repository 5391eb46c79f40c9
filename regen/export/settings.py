"""The settings of an export, one typed model from the manifest to the stage.

:class:`ExportSettings` is the run manifest's ``export:`` section (:class:`regen.manifest.Export`)
plus what one export chooses for itself and its stats.json records with it (format, inspection,
settings id: :class:`regen.store.layout.ExportChoices`), the drop-share limit, and the
manifest's ``quality:`` thresholds (the ``collapsed`` flag is decided at export).
``regen export``, ``regen train`` and the demo build it with :meth:`ExportSettings.of_run` (the
manifest's section, then their overrides) and hand it whole to
:func:`regen.export.run.export_run`. Owns no files.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel, Field, ValidationError, model_validator

from regen.core.errors import RegenError
from regen.manifest import Export, Manifest, config_error
from regen.quality.config import QualityConfig
from regen.store.layout import ExportChoices, ExportFormat, ExportStats
from regen.store.run import read_manifest_data
from regen.store.rundir import RunDir

log = logging.getLogger(__name__)

#: the settings of an export that decide which rows it keeps (stats.json records each)
ROW_SETTINGS = ("seed", "drop_truncated", "max_length", "holdout", "drop_flags", "keep_unproven")
#: the columns each format's lines are made of
DATA_COLUMNS: dict[ExportFormat, tuple[str, ...]] = {
    "pretokenized": ("input_ids", "loss_mask"),
    "conversations": (
        "sample_id",
        "turn",
        "messages",
        "tools",
        "reasoning",
        "content",
        "tool_calls",
        "attempt",
        "quality_flags",
    ),
}


class ExportSettings(ExportChoices):
    """Everything an export decides with (regen.export.run's docstring says how)."""

    #: refuse before writing anything when the rules would drop a larger share of the rows
    #: the export could train on (None: never refuse)
    max_drop_share: float | None = Field(default=None, ge=0.0, le=1.0)
    #: the run manifest's ``quality:`` section: its ``collapse_*`` thresholds decide the
    #: ``collapsed`` flag, found here across the rows of each source (regen.quality.collapse)
    quality: QualityConfig = Field(default_factory=QualityConfig)

    @model_validator(mode="after")
    def _flags_to_look_for(self) -> ExportSettings:
        if self.only_flagged and not self.drop_flags:
            raise ValueError("--only-flagged needs at least one flag to look for (drop_flags)")
        return self

    @classmethod
    def build(cls, **values: object) -> ExportSettings:
        """The settings from ``values`` (ConfigError naming the field when one is wrong)."""
        try:
            return cls.model_validate(values)
        except ValidationError as e:
            raise config_error(e, "export settings", model=cls) from None

    @classmethod
    def of_run(
        cls, rd: RunDir, manifest: Manifest | None = None, **overrides: object
    ) -> ExportSettings:
        """The ``export:`` and ``quality:`` sections of the run directory's manifest
        (``manifest`` when the caller has read it; their defaults where a section or the
        manifest is missing or unreadable, with a warning for the latter), then every override
        that is not None."""
        if manifest is not None:
            base = {**manifest.export.model_dump(), "quality": manifest.quality}
        else:
            base = _sections(rd)
        return cls.build(**base).overridden(**overrides)

    def overridden(self, **overrides: object) -> ExportSettings:
        """These settings with every override that is not None (validated again)."""
        given = {k: v for k, v in overrides.items() if v is not None}
        return self.build(**{**self.model_dump(), **given}) if given else self

    def row_difference(self, stats: ExportStats) -> str:
        """'' when the export ``stats`` (regen.store.layout.ExportStats) was made with these
        row-deciding settings as a pretokenized export of every kept row, else the first
        difference."""
        for key in ROW_SETTINGS:
            if getattr(stats, key) != getattr(self, key):
                return f"{key} was {getattr(stats, key)!r}, now {getattr(self, key)!r}"
        if stats.format != "pretokenized" or stats.only_flagged:
            flagged = " of flagged rows" if stats.only_flagged else ""
            return f"it is a {stats.format} export{flagged}"
        return ""


def _sections(rd: RunDir) -> dict[str, object]:
    """The ``export:`` section of ``rd``'s manifest.yaml as settings, with its ``quality:``
    section (the defaults where one is missing; a warning and the defaults where it is
    unreadable)."""
    try:
        data = read_manifest_data(rd) or {}
    except (OSError, RegenError, ValidationError, AttributeError) as e:
        log.warning("%s: the manifest is not readable (%s); using the export and quality "
                    "defaults", rd.uri, e)  # fmt: skip
        return {**Export().model_dump(), "quality": QualityConfig()}
    out: dict[str, BaseModel] = {}
    for name, model in (("export", Export), ("quality", QualityConfig)):
        try:
            section = data.get(name) or {}
            out[name] = model.model_validate(section)
        except (ValidationError, AttributeError) as e:
            log.warning("%s: the manifest's %s section is not readable (%s); using the "
                        "defaults", rd.uri, name, e)  # fmt: skip
            out[name] = model()
    return {**out["export"].model_dump(), "quality": out["quality"]}
