"""Draft training: train.yaml, the SpecForge run config, the traps, the Ray GPU job, serving.

Modules: :mod:`~regen.train.config` (train.yaml schema), :mod:`~regen.train.traps` (the checks
that refuse silently ruined drafts), :mod:`~regen.train.checks` (traps applied to a config),
:mod:`~regen.train.specforge_config` (run.yaml + draft config), :mod:`~regen.train.data`
(the export and prompts file training reads), :mod:`~regen.train.launch` (``launch_training``),
:mod:`~regen.train.preflight` (the job's entrypoint on the cluster), :mod:`~regen.serve.sglang`
(serve command, server verification). Nothing heavy is imported here.
"""
