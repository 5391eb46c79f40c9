"""The simulated server's routes besides chat: health (SGLang's generating check), the model
card, SGLang's ``/model_info`` and ``/server_info`` or vLLM's ``/version``, the ``/metrics``
page, and the simulator's own counters (``GET /stats``, ``POST /stats/reset``). Owns no files.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web

from regen.devkit.simulate.config import SIM_VERSION
from regen.devkit.simulate.metrics_page import CONTENT_TYPE as METRICS_CONTENT_TYPE
from regen.devkit.simulate.replies import JSON, dumps
from regen.devkit.simulate.scheduler import Job
from regen.devkit.simulate.state import SimState

log = logging.getLogger(__name__)


class InfoRoutes:
    """The handlers of every route but chat, over one server's state."""

    def __init__(self, state: SimState) -> None:
        self.state = state

    # ---- health ----------------------------------------------------------------------------

    async def health(self, _request: web.Request) -> web.Response:
        """SGLang 0.5.23 serves ``/health`` with the ``/health_generate`` handler unless
        ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION`` is off (``--no-health-endpoint-
        generation``); the simulator's vLLM dialect answers 200."""
        s = self.state
        if not s.dialect.health_generates or not s.config.health_endpoint_generation:
            return web.Response(status=200)
        return await self._health_check(generate=False)

    async def health_generate(self, _request: web.Request) -> web.Response:
        return await self._health_check(generate=True)

    async def _health_check(self, *, generate: bool) -> web.Response:
        """SGLang's ``health_generate``: a 1-token request, 200 as soon as the scheduler makes
        any output after the check began (a busy server passes at once), 503 when none came
        in ``HEALTH_CHECK_TIMEOUT`` seconds (a hung server). ``/health`` sends no job: a
        scheduler that is not hung always makes output within a step."""
        s = self.state
        loop = asyncio.get_running_loop()
        timeout = s.config.health_timeout_s
        deadline = loop.time() + timeout
        if not await s.hang.wait_resumed(timeout):
            return _health_failed(timeout)
        if generate and not s.config.instant:
            job = Job(total=1)
            s.scheduler.submit(job)
            try:
                await asyncio.wait_for(s.scheduler.next_output(), deadline - loop.time())
            except TimeoutError:
                job.cancelled = True
                return _health_failed(timeout)
        return web.Response(status=200)

    # ---- identity ----------------------------------------------------------------------------

    async def models(self, _request: web.Request) -> web.Response:
        s = self.state
        card = {
            "id": s.config.model_name,
            "object": "model",
            "created": s.created,
            "owned_by": s.dialect.owned_by,
            "root": s.model_path,
            "max_model_len": s.config.context_length,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def model_info(self, _request: web.Request) -> web.Response:
        s = self.state
        tok = str(s.config.tokenizer) if s.config.tokenizer else s.model_path
        return web.json_response(
            {
                "model_path": s.model_path,
                "tokenizer_path": tok,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "kimi_k25",
                "architectures": ["KimiK25ForConditionalGeneration"],
            }
        )

    async def version(self, _request: web.Request) -> web.Response:
        return web.json_response({"version": SIM_VERSION.replace("0.5.23", "0.32.0")})

    async def metrics_page(self, _request: web.Request) -> web.Response:
        """The engine's Prometheus page (:mod:`regen.devkit.simulate.metrics_page`)."""
        return web.Response(
            body=self.state.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE}
        )

    async def server_info(self, _request: web.Request) -> web.Response:
        # SGLang asks the scheduler for internal_states (get_internal_state, no timeout): a
        # hung server answers when the hang ends
        s = self.state
        await s.hang.wait_resumed()
        args = server_args(s)
        states = [internal_state(s, args) for _ in range(s.config.dp_size)]
        info = {**args, "internal_states": states, "version": SIM_VERSION,
                "simulator": simulator_info(s)}  # fmt: skip
        return web.json_response(info)

    # ---- the simulator's counters --------------------------------------------------------------

    async def stats_view(self, request: web.Request) -> web.Response:
        with_keys = request.query.get("keys", "0") not in ("0", "", "false")
        return web.Response(body=dumps(stats_dict(self.state, with_keys)), content_type=JSON)

    async def stats_reset(self, _request: web.Request) -> web.Response:
        self.state.stats.reset()
        self.state.scheduler.reset_counters()
        return web.Response(body=b"{}", content_type=JSON)


def _health_failed(timeout: float) -> web.Response:
    log.error("Health check failed. Server couldn't get a response from the scheduler for "
              "the last %g seconds.", timeout)  # fmt: skip
    return web.Response(status=503)


def server_args(s: SimState) -> dict[str, Any]:
    """SGLang's resolved server arguments, as ``/server_info`` lists them."""
    c = s.config
    return {
        "model_path": s.model_path,
        "tokenizer_path": str(c.tokenizer) if c.tokenizer else s.model_path,
        "served_model_name": c.model_name,
        "host": c.host,
        "port": s.port,
        "context_length": c.context_length,
        "max_running_requests": c.max_running_requests,
        "max_queued_requests": c.max_queued_requests,
        "max_total_tokens": c.max_total_tokens,
        "enable_metrics": c.enable_metrics,
        "dp_size": c.dp_size,
        "tp_size": 8,
        "enable_deterministic_inference": c.enable_deterministic_inference,
        "trust_remote_code": True,
        "tool_call_parser": "kimi_k2",
        "reasoning_parser": "kimi_k2",
        "speculative_algorithm": c.speculative_algorithm,
        "speculative_draft_model_path": c.speculative_draft_model_path,
        "speculative_num_steps": c.speculative_num_steps,
        "speculative_eagle_topk": c.speculative_eagle_topk,
        "speculative_num_draft_tokens": c.speculative_num_draft_tokens,
        "enable_cache_report": False,
    }


def internal_state(s: SimState, args: dict[str, Any]) -> dict[str, Any]:
    """SGLang: one entry per DP rank, the resolved server args plus live state; the live
    batch size is effective_max_running_requests_per_dp (the top-level max_running_requests
    is the CLI flag, None unless given)."""
    c = s.config
    state: dict[str, Any] = {
        **args,
        "effective_max_running_requests_per_dp": c.slots // c.dp_size,
        "last_gen_throughput": s.metrics.throughput() / c.dp_size,
        "memory_usage": {},
        "num_running_reqs": s.scheduler.n_running,
        "num_queue_reqs": s.scheduler.n_queued,
    }
    # SGLang: the running total since start, left out before its first verify step
    accept = s.spec.counters.avg_accept_length if s.spec is not None else None
    if accept is not None:
        state["avg_spec_accept_length"] = accept
    return state


def simulator_info(s: SimState) -> dict[str, Any]:
    """What the simulator models (``/server_info``'s ``simulator``)."""
    c = s.config
    return {
        "step_ms": c.step_ms,
        "tokens_per_step": c.tokens_per_step,
        "capacity_tok_s": c.capacity_tok_s,
        "instant": c.instant,
        "usage_shape": c.usage_shape,
        "slots": c.slots,
        "answer": c.answer.model_dump(),
        "faults": c.faults.model_dump(mode="json"),
        "speculative": s.spec.describe() if s.spec is not None else None,
        "outages": {
            "hang_at_s": c.hang_at_s,
            "hang_after": c.hang_after,
            "hang_for_s": c.hang_for_s,
            "hangs": s.hang.count,
            "overload_at_s": c.overload_at_s,
            "overload_after": c.overload_after,
            "overload_for_s": c.overload_for_s,
            "health_check_timeout_s": c.health_timeout_s,
        },
    }


def stats_dict(s: SimState, with_keys: bool = False) -> dict[str, Any]:
    """``GET /stats``: the request counters, the scheduler's, the outages', the prefix
    cache's and the background client's; ``with_keys``: per-key and per-conversation request
    counts too."""
    rc = s.stats.counters
    now = time.monotonic()
    out: dict[str, Any] = {
        "received": rc.received,
        "completed": rc.completed,
        "failed": dict(rc.failed),
        "failed_total": sum(rc.failed.values()),
        "stalled": rc.stalled,
        "errors": dict(rc.errors),
        "client_gone": rc.client_gone,
        "running": s.scheduler.n_running,
        "queued": s.scheduler.n_queued,
        "prompt_tokens": rc.prompt_tokens,
        "completion_tokens": rc.completion_tokens,
        **_scheduler_stats(s, now),
        "uptime_s": now - s.stats.started,
        "queue_full": rc.queue_full,
        "hung": s.hang.hung,
        "hangs": s.hang.count,
        "overloaded": s.overload.active(),
        "overload_started_s": None
        if s.overload.started_at is None
        else s.overload.started_at - s.stats.started,
    }
    cache = s.cache
    if cache is not None:
        cc = cache.counters
        out["prefix_cache"] = {"queries": cc.queries, "hits": cc.hits,
                               "hit_rate": cc.hit_rate, "held_tokens": cache.tokens,
                               "capacity_tokens": cache.capacity,
                               "block_size": cache.block_size,
                               "evicted_tokens": cc.evicted}  # fmt: skip
    bg = s.background
    if bg is not None:
        out["background"] = {"requests": bg.requests, "completed": bg.counters.completed,
                             "tokens": bg.counters.tokens}  # fmt: skip
    if with_keys:
        out["keys"] = dict(s.stats.attempts)
        out["conversations"] = dict(s.stats.conversations)
    return out


def _scheduler_stats(s: SimState, now: float) -> dict[str, Any]:
    """The scheduler's counters and the utilization of its capacity since the first request."""
    rc, sc = s.stats.counters, s.scheduler.counters
    cap = s.config.capacity_tok_s
    window = now - rc.first_request_at if rc.first_request_at is not None else 0.0
    return {
        "tokens_generated": sc.tokens,
        "prefill_tokens": sc.prefill_tokens,
        "prefill_s": sc.prefill_s,
        "steps": sc.steps,
        "late_steps": sc.late_steps,
        "busy_s": sc.busy_s,
        "mean_batch_occupancy": (sc.slot_steps / (sc.steps * s.config.slots) if sc.steps else 0.0),
        "capacity_tok_s": cap,
        "window_s": window,
        "utilization": sc.tokens / (cap * window) if window > 0 else 0.0,
    }
