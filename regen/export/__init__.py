"""The export stage: a run directory's rows as SpecForge reads them.

- :mod:`regen.export.settings`: :class:`ExportSettings`, one typed model from the manifest;
- :mod:`regen.export.select`: which rows are written, and the stats of what was dropped;
- :mod:`regen.export.write`: the shards' lines, with bounded memory;
- :mod:`regen.export.holdout`: the samples kept out for ``regen bench``;
- :mod:`regen.export.run`: :func:`export_run`, the stage (its docstring has the rules).
"""

from regen.export.run import export_run
from regen.export.settings import ExportSettings
from regen.store.layout import ExportStats

__all__ = ["ExportSettings", "ExportStats", "export_run"]
