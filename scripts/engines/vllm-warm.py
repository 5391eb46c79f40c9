"""Fill vLLM's model-class cache for the architectures regen's tests serve.

Run by scripts/test with the vLLM environment's Python, ``VLLM_CACHE_ROOT`` set to the
checkout's ``.cache/vllm`` (tests/conftest.py gives every test process the same root). A vLLM
server inspects its model's class (and its draft's) in a subprocess of its own that imports
vLLM, ~12 CPU-s here, unless ``$VLLM_CACHE_ROOT/modelinfos`` holds that class's record, keyed
by the hash of its source file (``vllm/model_executor/models/registry.py``,
``_LazyRegisteredModel``). In a fresh clone the suite's first servers paid that, four times on
2026-12-07; this does it once, before the tests, through the same registry call a server makes.
Once done, it leaves ``modelinfos/.regen-warm`` holding the vLLM environment's install stamp
and the architectures, and a later call with the same ones returns before importing vLLM.

Arguments: the architectures (default :data:`ARCHS`). Exits 0 whatever happens: a failed
warm-up only means the servers inspect the class themselves, as vLLM does without a cache.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: every demo target and the engine tests' scripted target are Llama-shaped; the drafts are
#: EAGLE-3 (the loop, the speculative server) and EAGLE (tests/engines/test_vllm_eagle.py)
ARCHS = ("LlamaForCausalLM", "Eagle3LlamaForCausalLM", "EagleLlamaForCausalLM")


def main(archs: list[str]) -> int:
    root = os.environ.get("VLLM_CACHE_ROOT")
    if not root:
        print("vllm-warm: VLLM_CACHE_ROOT is not set: nothing to warm", file=sys.stderr)
        return 0
    marker = Path(root) / "modelinfos" / ".regen-warm"
    install = Path(sys.prefix) / ".regen-vllm-stamp"  # scripts/vllm-env's
    want = " ".join([install.read_text().strip() if install.exists() else "-", *archs])
    if marker.exists() and marker.read_text().strip() == want:
        return 0
    try:
        from vllm.model_executor.models.registry import ModelRegistry
    except Exception as e:  # an environment without vLLM: the tests skip anyway
        print(f"vllm-warm: vLLM not importable ({type(e).__name__}: {e})", file=sys.stderr)
        return 0
    warmed = 0
    for arch in archs:
        # vLLM's private call, the one a server's config makes: the cache when current, else
        # the inspecting subprocess, whose result it then stores
        info = ModelRegistry._try_inspect_model_cls(arch)
        print(f"vllm-warm: {arch}: {'ready' if info is not None else 'not inspected'}")
        warmed += info is not None
    if warmed == len(archs):  # the marker only once every class is in the cache
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(want + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(ARCHS)))
