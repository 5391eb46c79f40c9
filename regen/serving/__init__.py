"""A real local server for the demo and end-to-end tests: the demo target and `transformers serve`.

Files owned: the demo target folder (see :mod:`regen.serving.demo_target`) and, optionally,
the server log (see :mod:`regen.serving.server`).
"""

from regen.serving.demo_target import build_demo_target
from regen.serving.server import TransformersServer, free_port

__all__ = ["TransformersServer", "build_demo_target", "free_port"]
