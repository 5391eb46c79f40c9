"""Real local servers for the demo and end-to-end tests: the demo target, `transformers serve`
(:mod:`regen.serving.server`) and vLLM (:mod:`regen.serving.vllm`), both run as processes by
:class:`regen.serving.local.LocalServer`.

Files owned: the demo target folder (see :mod:`regen.serving.demo_target`) and, optionally,
a server's log (see :mod:`regen.serving.local`).
"""

from regen.serving.demo_target import build_demo_target
from regen.serving.server import TransformersServer, free_port

__all__ = ["TransformersServer", "build_demo_target", "free_port"]
