"""The live dashboard of a run (`regen monitor RUN_DIR`): reads the run directory only.

Modules: :mod:`monitor.render` (one frame from :class:`regen.status.RunNumbers`),
:mod:`monitor.live` (the refreshing terminal view, also started by `regen run`),
:mod:`monitor.plain` (one log line per tick when stdout is not a terminal),
:mod:`regen.devkit.synthetic` (synthetic run directories for tests, benchmark and README capture).
This package owns no files; what it reads is described in :mod:`regen.status`.
"""
