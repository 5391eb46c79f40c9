"""Greedy answers with and without the draft: speculative decoding must not change them.

Every prompt goes, one at a time, to the target alone and to the target with the draft, with
the run's sampling at temperature 0 (``top_p`` 1) and the engine's exact output ids
(:class:`regen.client.ChatClient`, vLLM's profile, ``return_token_ids``). Two answers are
identical when their output token ids are. Owns no files.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from regen.client import ChatClient
from regen.core.errors import EndpointError
from regen.devkit.loop.record import GreedyRecord
from regen.manifest import Endpoint, Sampling
from regen.store.holdout import BenchPrompt

#: seconds one greedy answer may take
TIMEOUT_S = 300.0


def greedy_sampling(sampling: Sampling, max_tokens: int) -> Sampling:
    """``sampling`` made greedy, with the exact ids of one JSON answer per request."""
    data = sampling.model_dump() | {
        "temperature": 0.0, "top_p": 1.0, "top_k": None, "seed": None,
        "max_tokens": max_tokens, "token_ids": "nonstream",
    }  # fmt: skip
    return Sampling.model_validate(data)


async def _answers(
    url: str,
    model: str,
    sampling: Sampling,
    prompts: Sequence[BenchPrompt],
    template_kwargs: dict[str, Any],
) -> list[tuple[int, ...]]:
    client = ChatClient(Endpoint(url=url), model=model, sampling=sampling, engine="vllm",
                        timeout_s=TIMEOUT_S, template_kwargs=template_kwargs)  # fmt: skip
    try:
        out = []
        for p in prompts:
            r = await client.complete_once(p.messages, p.tools, sample_id=p.sample_id)
            if r.output_token_ids is None:  # nothing to compare: never "identical"
                raise EndpointError(f"{url} returned no output token ids for {p.sample_id}")
            out.append(tuple(r.output_token_ids))
        return out
    finally:
        await client.aclose()


def compare_greedy(
    baseline: str,
    speculative: str,
    prompts: Sequence[BenchPrompt],
    *,
    model: str,
    sampling: Sampling,
    max_tokens: int,
    template_kwargs: dict[str, Any] | None = None,
) -> GreedyRecord:
    """Every prompt greedy on both servers (vLLM, ``/v1`` URLs); the answers compared;
    ``template_kwargs``: the requests' chat_template_kwargs (the manifest's)."""
    s = greedy_sampling(sampling, max_tokens)
    kwargs = dict(template_kwargs or {})
    base = asyncio.run(_answers(baseline, model, s, prompts, kwargs))
    spec = asyncio.run(_answers(speculative, model, s, prompts, kwargs))
    differing = [p.sample_id for p, a, b in zip(prompts, base, spec, strict=True) if a != b]
    return GreedyRecord(
        prompts=len(prompts),
        identical=len(prompts) - len(differing),
        tokens=sum(len(a) for a in base),
        differing=differing,
    )
