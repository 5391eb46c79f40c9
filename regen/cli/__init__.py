"""The `regen` command line. Each command is one module in this package.

A command module defines ``NAME`` (the subcommand), ``HELP`` (one line), ``add_arguments(parser)``
and ``run(args) -> int``. ``regen.cli.main`` finds them by scanning this package, so adding a
command never edits a shared file. Command modules import heavy libraries (ray, torch,
transformers) inside ``run``, so ``regen --help`` stays fast.
"""
