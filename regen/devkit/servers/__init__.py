"""Real local servers for the demo and end-to-end tests: the demo target, `transformers serve`
(:mod:`regen.devkit.servers.transformers`) and vLLM (:mod:`regen.devkit.servers.vllm`), both run as
processes by :class:`regen.devkit.servers.local.LocalServer`.

Files owned: the demo target folder (see :mod:`regen.devkit.demo_target`) and, optionally,
a server's log (see :mod:`regen.devkit.servers.local`).
"""

from regen.devkit.demo_target import build_demo_target
from regen.devkit.servers.transformers import TransformersServer, free_port

__all__ = ["TransformersServer", "build_demo_target", "free_port"]
