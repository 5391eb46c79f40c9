"""A real local server for the demo and end-to-end tests: the tiny model and `transformers serve`.

Files owned: the tiny model folder (see :mod:`regen.serving.tiny_model`) and, optionally, the
server log (see :mod:`regen.serving.server`).
"""

from regen.serving.server import TransformersServer, free_port
from regen.serving.tiny_model import build_tiny_model

__all__ = ["TransformersServer", "build_tiny_model", "free_port"]
