"""The simulated server: aiohttp handlers over the answer, capacity and fault models.

It speaks SGLang 0.5.23 as that version's own code does (docs/simulate.md has the table of
what SGLang does and what the simulator does, field by field), or, with ``--engine vllm``,
vLLM 0.32's wire (:mod:`regen.devkit.simulate.dialect`: ids, reasoning field, identity endpoints,
error and overload shapes). Endpoints: ``/health``, ``/health_generate``, ``/v1/models``,
SGLang's ``/model_info`` (+ ``/get_model_info``) and ``/server_info`` (+ ``/get_server_info``)
or vLLM's ``/version``, ``/metrics`` (vLLM's, or SGLang's with ``--enable-metrics``:
:mod:`regen.devkit.simulate.metrics_page`), ``/v1/chat/completions`` (streaming and not),
``GET /stats`` (``?keys=1`` adds per-key and per-conversation request counts) and
``POST /stats/reset``. A scheduled hang of the whole server and a scheduled 503 storm are
:mod:`regen.devkit.simulate.outage`'s. Owns no files except the optional request log (see
:mod:`.stats`) and the ready file (one line: the base URL with ``/v1``, as ``regen run
--endpoint`` takes it, written atomically once listening).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from json.encoder import encode_basestring_ascii as _enc
from pathlib import Path
from typing import Any

from aiohttp import web

from regen.core.errors import ArgumentsError, RegenError
from regen.devkit.simulate.answer import SimAnswer, answer, requested_max_tokens, thinking_enabled
from regen.devkit.simulate.background import BackgroundClient
from regen.devkit.simulate.config import SIM_VERSION, SimConfig
from regen.devkit.simulate.dialect import DIALECTS
from regen.devkit.simulate.faults import Fault
from regen.devkit.simulate.keys import conversation_key, request_key
from regen.devkit.simulate.metrics_page import CONTENT_TYPE as METRICS_CONTENT_TYPE
from regen.devkit.simulate.metrics_page import SimMetrics
from regen.devkit.simulate.outage import Hang, OverloadWindow
from regen.devkit.simulate.prefix_cache import (
    PrefixCache,
    Segment,
    after_answer,
    answer_segment,
    message_segments,
    salt_of,
    token_segments,
)
from regen.devkit.simulate.scheduler import Job, Scheduler
from regen.devkit.simulate.stats import RequestStats
from regen.devkit.simulate.tokenized import AnswerTokenizer, TokenIds
from regen.devkit.simulate.tokens import GENERATION_PROMPT
from regen.devkit.simulate.tokens import prompt_tokens as sim_prompt_tokens
from regen.template.prepare import parse_arguments

log = logging.getLogger(__name__)

#: `<|im_end|>` in the Kimi vocabulary: what SGLang reports as matched_stop
IM_END_ID = 163586

_JSON = "application/json"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}

#: path prefixes that need no API key even with --api-key: SGLang's (utils/auth.py: health,
#: readiness, metrics) and the simulator's own test counters
OPEN_PREFIXES = ("/health", "/ready", "/metrics", "/stats")

#: SGLang's messages for the 503s it sends (scheduler.py, schedule_batch.py)
QUEUE_FULL = "The request queue is full."
RETRACTED = "Retracted under decode memory pressure without a KV backup. Retry later."

#: the request log's fault of a request refused by the scheduled 503 storm (--overload-at-s)
OVERLOAD_WINDOW = "overload_window"

#: seconds open requests get to finish when the server stops
SHUTDOWN_TIMEOUT_S = 0.5

#: request-storage key: the HTTP status a request's response has sent (headers on the wire)
SENT = web.RequestKey("regen_sim_sent_status", int)


@functools.lru_cache(maxsize=1 << 16)
def _text_json(text: str) -> bytes:
    """``text`` as a JSON string literal (cached: answers reuse a small set of pieces)."""
    return _enc(text).encode()


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


class _ClientGone(Exception):
    """The client hung up; ``response`` is the prepared response to hand back to aiohttp."""

    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response


class _Invalid(Exception):
    def __init__(self, response: web.Response) -> None:
        self.response = response


class SimServer:
    """State of one simulated server; ``app()`` builds its aiohttp application."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.stats = RequestStats(config.request_log)
        #: the speed model of a speculative server (None: a plain one)
        self.spec = config.speculation()
        self.scheduler = Scheduler(
            config.slots,
            config.step_s,
            config.tokens_per_step,
            spec=self.spec,
            prefill_s_per_token=config.prefill_us_per_token / 1e6,
            chunk=config.chunked_prefill_size,
        )
        #: the prefix cache (None: --no-prefix-cache), regen.devkit.simulate.prefix_cache
        self.cache = (
            PrefixCache(config.cache_tokens, config.cache_block_size)
            if config.prefix_cache
            else None
        )
        self.tokenizer: AnswerTokenizer | None = None
        self.created = int(time.time())
        self.port = config.port  #: the bound port once listening
        self.model_json = _enc(config.model_name).encode()
        self.dialect = DIALECTS[config.engine]
        #: the /metrics page (SGLang's or vLLM's names), over the live scheduler
        self.metrics = SimMetrics(config, self.scheduler, self.spec)
        #: the other client of a shared server (None: this server has only HTTP clients)
        self.background = (
            BackgroundClient(
                self.scheduler,
                self.metrics,
                requests=config.background_requests,
                max_tokens=config.background_max_tokens,
                prompt_tokens=config.background_prompt_tokens,
            )
            if config.background_requests and not config.instant
            else None
        )
        #: a scheduled hang of the whole server, and a scheduled 503 storm
        #: (regen.devkit.simulate.outage)
        self.hang = Hang(
            None if config.instant else self.scheduler,
            self.metrics,
            at_s=config.hang_at_s,
            after=config.hang_after,
            for_s=config.hang_for_s,
        )
        self.overload = OverloadWindow(
            config.overload_at_s, config.overload_for_s, config.overload_after
        )
        self.health_timeout_s = config.health_timeout_s

    def _error(
        self, status: int, message: str, err_type: str, param: str | None = None, **headers: str
    ) -> web.Response:
        """An error response in this dialect's body shape."""
        body = self.dialect.error_body(status, message, err_type, param)
        return web.Response(status=status, body=_dumps(body), content_type=_JSON, headers=headers)

    # ---- lifecycle -------------------------------------------------------------------------

    def app(self) -> web.Application:
        middlewares = [self._check_key] if self.config.api_key else []
        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=middlewares)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health_generate)
        r.add_get("/v1/models", self.models)
        if self.dialect.server_info:
            for path in ("/model_info", "/get_model_info"):
                r.add_get(path, self.model_info)
            for path in ("/server_info", "/get_server_info"):
                r.add_get(path, self.server_info)
        else:
            r.add_get("/version", self.version)
        if self.dialect.metrics_always or self.config.enable_metrics:
            r.add_get("/metrics", self.metrics_page)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_get("/stats", self.stats_view)
        r.add_post("/stats/reset", self.stats_reset)
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, _app: web.Application) -> None:
        if self.config.tokenizer is not None:
            self.tokenizer = await asyncio.to_thread(
                AnswerTokenizer,
                self.config.tokenizer,
                self.config.tokenizer_class,
                self.dialect.name,
            )
        if not self.config.instant:
            self.scheduler.start()
        if self.background is not None:
            self.background.start()

    def serving(self) -> None:
        """The server listens: the outages' clocks start."""
        self.hang.serving()
        self.overload.serving()

    async def _cleanup(self, _app: web.Application) -> None:
        self.hang.close()
        self.overload.close()
        if self.background is not None:
            await self.background.stop()
        await self.scheduler.stop()
        self.stats.close()

    @web.middleware
    async def _check_key(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """SGLang's --api-key: a wrong or missing bearer token is a 401 with SGLang's body
        ``{"error": "Unauthorized"}`` (open prefixes aside)."""
        if not request.path.startswith(OPEN_PREFIXES):
            want = f"Bearer {self.config.api_key}".encode()
            got = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(got, want):
                self.stats.counters.errors["401"] += 1
                return web.Response(
                    status=401, body=b'{"error":"Unauthorized"}', content_type=_JSON
                )
        return await handler(request)

    # ---- info endpoints --------------------------------------------------------------------

    async def health(self, _request: web.Request) -> web.Response:
        """SGLang 0.5.23 serves ``/health`` with the ``/health_generate`` handler unless
        ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION`` is off (``--no-health-endpoint-
        generation``); the simulator's vLLM dialect answers 200."""
        if not self.dialect.health_generates or not self.config.health_endpoint_generation:
            return web.Response(status=200)
        return await self._health_check(generate=False)

    async def health_generate(self, _request: web.Request) -> web.Response:
        return await self._health_check(generate=True)

    async def _health_check(self, *, generate: bool) -> web.Response:
        """SGLang's ``health_generate``: a 1-token request, 200 as soon as the scheduler makes
        any output after the check began (a busy server passes at once), 503 when none came
        in ``HEALTH_CHECK_TIMEOUT`` seconds (a hung server). ``/health`` sends no job: a
        scheduler that is not hung always makes output within a step."""
        loop = asyncio.get_running_loop()
        timeout = self.health_timeout_s
        deadline = loop.time() + timeout
        if not await self.hang.wait_resumed(timeout):
            return self._health_failed(timeout)
        if generate and not self.config.instant:
            job = Job(total=1)
            self.scheduler.submit(job)
            try:
                await asyncio.wait_for(self.scheduler.next_output(), deadline - loop.time())
            except TimeoutError:
                job.cancelled = True
                return self._health_failed(timeout)
        return web.Response(status=200)

    @staticmethod
    def _health_failed(timeout: float) -> web.Response:
        log.error("Health check failed. Server couldn't get a response from the scheduler for "
                  "the last %g seconds.", timeout)  # fmt: skip
        return web.Response(status=503)

    @property
    def model_path(self) -> str:
        return self.config.model_path or self.config.model_name

    async def models(self, _request: web.Request) -> web.Response:
        card = {
            "id": self.config.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": self.dialect.owned_by,
            "root": self.model_path,
            "max_model_len": self.config.context_length,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def model_info(self, _request: web.Request) -> web.Response:
        tok = str(self.config.tokenizer) if self.config.tokenizer else self.model_path
        return web.json_response(
            {
                "model_path": self.model_path,
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
            body=self.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE}
        )

    def server_args(self) -> dict[str, Any]:
        c = self.config
        return {
            "model_path": self.model_path,
            "tokenizer_path": str(c.tokenizer) if c.tokenizer else self.model_path,
            "served_model_name": c.model_name,
            "host": c.host,
            "port": self.port,
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

    async def server_info(self, _request: web.Request) -> web.Response:
        # SGLang asks the scheduler for internal_states (get_internal_state, no timeout): a
        # hung server answers when the hang ends
        await self.hang.wait_resumed()
        c = self.config
        args = self.server_args()
        states = []
        for _ in range(c.dp_size):
            # SGLang: one entry per DP rank, the resolved server args plus live state; the
            # live batch size is effective_max_running_requests_per_dp (the top-level
            # max_running_requests is the CLI flag, None unless given)
            state: dict[str, Any] = {
                **args,
                "effective_max_running_requests_per_dp": c.slots // c.dp_size,
                "last_gen_throughput": self.metrics.throughput() / c.dp_size,
                "memory_usage": {},
                "num_running_reqs": self.scheduler.n_running,
                "num_queue_reqs": self.scheduler.n_queued,
            }
            # SGLang: the running total since start, left out before its first verify step
            accept = self.spec.counters.avg_accept_length if self.spec is not None else None
            if accept is not None:
                state["avg_spec_accept_length"] = accept
            states.append(state)
        info = {
            **args,
            "internal_states": states,
            "version": SIM_VERSION,
            "simulator": {
                "step_ms": c.step_ms,
                "tokens_per_step": c.tokens_per_step,
                "capacity_tok_s": c.capacity_tok_s,
                "instant": c.instant,
                "usage_shape": c.usage_shape,
                "slots": c.slots,
                "answer": c.answer.model_dump(),
                "faults": c.faults.model_dump(mode="json"),
                "speculative": self.spec.describe() if self.spec is not None else None,
                "outages": {
                    "hang_at_s": c.hang_at_s,
                    "hang_after": c.hang_after,
                    "hang_for_s": c.hang_for_s,
                    "hangs": self.hang.count,
                    "overload_at_s": c.overload_at_s,
                    "overload_after": c.overload_after,
                    "overload_for_s": c.overload_for_s,
                    "health_check_timeout_s": self.health_timeout_s,
                },
            },
        }
        return web.json_response(info)

    # ---- stats -----------------------------------------------------------------------------

    def stats_dict(self, with_keys: bool = False) -> dict[str, Any]:
        rc = self.stats.counters
        sc = self.scheduler.counters
        now = time.monotonic()
        cap = self.config.capacity_tok_s
        busy = sc.busy_s
        window = now - rc.first_request_at if rc.first_request_at is not None else 0.0
        out: dict[str, Any] = {
            "received": rc.received,
            "completed": rc.completed,
            "failed": dict(rc.failed),
            "failed_total": sum(rc.failed.values()),
            "stalled": rc.stalled,
            "errors": dict(rc.errors),
            "client_gone": rc.client_gone,
            "running": self.scheduler.n_running,
            "queued": self.scheduler.n_queued,
            "prompt_tokens": rc.prompt_tokens,
            "completion_tokens": rc.completion_tokens,
            "tokens_generated": sc.tokens,
            "prefill_tokens": sc.prefill_tokens,
            "prefill_s": sc.prefill_s,
            "steps": sc.steps,
            "late_steps": sc.late_steps,
            "busy_s": busy,
            "mean_batch_occupancy": (
                sc.slot_steps / (sc.steps * self.config.slots) if sc.steps else 0.0
            ),
            "capacity_tok_s": cap,
            "window_s": window,
            "utilization": sc.tokens / (cap * window) if window > 0 else 0.0,
            "uptime_s": now - self.stats.started,
            "queue_full": rc.queue_full,
            "hung": self.hang.hung,
            "hangs": self.hang.count,
            "overloaded": self.overload.active(),
            "overload_started_s": None
            if self.overload.started_at is None
            else self.overload.started_at - self.stats.started,
        }
        cache = self.cache
        if cache is not None:
            cc = cache.counters
            out["prefix_cache"] = {"queries": cc.queries, "hits": cc.hits,
                                   "hit_rate": cc.hit_rate, "held_tokens": cache.tokens,
                                   "capacity_tokens": cache.capacity,
                                   "block_size": cache.block_size,
                                   "evicted_tokens": cc.evicted}  # fmt: skip
        bg = self.background
        if bg is not None:
            out["background"] = {"requests": bg.requests, "completed": bg.counters.completed,
                                 "tokens": bg.counters.tokens}  # fmt: skip
        if with_keys:
            out["keys"] = dict(self.stats.attempts)
            out["conversations"] = dict(self.stats.conversations)
        return out

    async def stats_view(self, request: web.Request) -> web.Response:
        with_keys = request.query.get("keys", "0") not in ("0", "", "false")
        return web.Response(body=_dumps(self.stats_dict(with_keys)), content_type=_JSON)

    async def stats_reset(self, _request: web.Request) -> web.Response:
        self.stats.reset()
        self.scheduler.reset_counters()
        return web.Response(body=b"{}", content_type=_JSON)

    # ---- chat completions ------------------------------------------------------------------

    def _validate(self, body: Any) -> None:
        if not isinstance(body, dict):
            raise _Invalid(
                self._error(400, "request body must be a JSON object", "BadRequestError")
            )
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _Invalid(self._error(400, "messages must be a non-empty list", "BadRequestError"))
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _Invalid(
                    self._error(400, f"messages[{i}] needs a string role", "BadRequestError")
                )
        model = body.get("model")
        if model not in (self.config.model_name, self.model_path):
            raise _Invalid(
                self._error(404, f"The model `{model}` does not exist.", "NotFoundError")
                if not self.dialect.model_404_aliases
                else self._error(
                    404,
                    f"The model `{model}` does not exist. Valid aliases: {self.config.model_name}.",
                    "NotFoundError",
                    "model",
                )
            )
        n = body.get("n")
        if n not in (None, 1):
            raise _Invalid(self._error(400, "the simulator supports n=1 only", "BadRequestError"))
        if self.dialect.strict_arguments:
            self._check_history_arguments(messages)

    def _check_history_arguments(self, messages: list[dict[str, Any]]) -> None:
        """SGLang's 400 for a history tool call whose arguments are not a JSON object
        (``serving_chat.py`` ``normalize_assistant_tool_call_arguments``, strict)."""
        for m in messages:
            if m.get("role") != "assistant" or not isinstance(m.get("tool_calls"), list):
                continue
            for call in m["tool_calls"]:
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    try:
                        parse_arguments(fn["arguments"], "refuse")
                    except ArgumentsError as e:
                        message = str(e).split(" (tool call", 1)[0]
                        raise _Invalid(self._error(400, message, "BadRequest")) from None

    def _context_check(self, n_prompt: int, max_tokens: int | None) -> None:
        ctx = self.config.context_length
        if n_prompt >= ctx:
            msg, param = self.dialect.long_prompt_error(n_prompt, ctx)
            raise _Invalid(self._error(400, msg, "BadRequestError", param))
        if max_tokens is not None and n_prompt + max_tokens > ctx:
            msg = (
                f"Requested token count exceeds the model's maximum context length of {ctx} "
                f"tokens. You requested a total of {n_prompt + max_tokens} tokens: {n_prompt} "
                f"tokens from the input messages and {max_tokens} tokens for the completion. "
                "Please reduce the number of tokens in the input messages or the completion to "
                "fit within the limit."
            )
            raise _Invalid(self._error(400, msg, "BadRequestError"))

    def _queue_full(self) -> bool:
        """Whether a request arriving now is refused for a full queue: SGLang counts the
        waiting queue (``len(waiting_queue) + 1 > max_queued_requests``), vLLM every
        unfinished request (running and waiting, ``--max-num-queued-reqs``). Each of SGLang's
        data-parallel schedulers applies the flag to its own queue, so this one scheduler,
        which stands for all of them, holds ``dp_size`` times as many."""
        limit = self.config.max_queued_requests
        if limit is None or self.config.instant:
            return False
        held = self.scheduler.n_queued
        if self.dialect.queue_counts_running:
            held += self.scheduler.n_running
        else:
            limit *= self.config.dp_size
        return held + 1 > limit

    async def chat(self, request: web.Request) -> web.StreamResponse:
        stats = self.stats
        received_at = time.monotonic()
        hang = self.hang
        hang.request()  # the hang_after-th request starts the hang
        self.overload.request()  # ... and the overload_after-th the 503 storm
        hangs_before, hung_before = hang.count, hang.hung
        try:
            body, stream = await self._read_request(request)
        except _Invalid as e:
            stats.counters.received += 1
            stats.counters.errors[str(e.response.status)] += 1
            return e.response

        key = request_key(body)
        conv = conversation_key(body)
        attempt = stats.receive(key, conv)

        def record(**line: Any) -> None:
            """A request-log line; ``hung: true`` when a hang held this request."""
            if hung_before or hang.hung or hang.count != hangs_before:
                line["hung"] = True
            stats.record(key=key, conversation=conv, attempt=attempt, **line)

        try:
            result = await self._answer(body, key, attempt)
        except _Invalid as e:  # answered by the HTTP layer, hung or not (as SGLang's)
            stats.counters.errors[str(e.response.status)] += 1
            record(status=e.response.status, fault=None)
            return e.response
        except RegenError as e:
            stats.counters.errors["500"] += 1
            return self._error(500, str(e), "InternalServerError")
        ans, ids, fault, segments = result
        n_prompt = len(ids.prompt) if ids else ans.prompt_tokens
        try:  # a hung scheduler takes nothing in: the request waits, without a byte sent
            await hang.wait_resumed()
        except asyncio.CancelledError:
            self._gone(request, record)
            raise
        storm = self.overload.active()
        if storm:  # a scheduled 503 storm refuses every new request as Fault.OVERLOAD does
            fault = Fault.OVERLOAD
        refused = await self._refuse(request, body, fault, storm, n_prompt, record)
        if refused is not None:
            return refused
        job = self._admit(body, ans, n_prompt, received_at, segments)
        usage = self._usage(ans, ids, n_prompt, job.cached if self.config.enable_cache_report
                            else None)  # fmt: skip
        done = functools.partial(self._finished, ans=ans, job=job, fault=fault, usage=usage,
                                 stream=stream, received_at=received_at,
                                 record=record, ids=ids, segments=segments)  # fmt: skip
        if fault in (Fault.DISCONNECT, Fault.RETRACT, Fault.ABORT):  # counted up front
            stats.counters.failed[fault.value] += 1
            self.metrics.aborted()
            status = 503 if fault is Fault.RETRACT and not stream else 200
            record(status=status, fault=fault.value)
        try:
            if stream:
                return await self._stream(request, body, ans, ids, job, fault, usage, done)
            return await self._complete(request, body, ans, ids, job, fault, usage, done)
        except (_ClientGone, asyncio.CancelledError) as e:
            if stream:  # a closed stream: SGLang aborts it ~2 s later, vLLM at once
                self.scheduler.close(job, self.config.abort_delay)
            else:
                job.cancelled = True
            self._gone(request, record)
            if isinstance(e, _ClientGone):
                return e.response
            raise

    async def _read_request(self, request: web.Request) -> tuple[dict[str, Any], bool]:
        """The request's body, validated, and whether it streams (_Invalid: its 400)."""
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            raise _Invalid(
                self._error(400, "request body is not valid JSON", "BadRequestError")
            ) from None
        self._validate(body)
        stream = bool(body.get("stream"))
        want_prompt_ids = bool(body.get("return_prompt_token_ids"))
        want_ids = bool(body.get("return_token_ids"))
        if self.dialect.vllm_ids:  # return_token_ids streams too; needs ids
            want_prompt_ids, want_ids = self.dialect.asks_ids(body, stream)
        elif (want_ids or want_prompt_ids) and stream:
            raise _Invalid(
                self._error(
                    400,
                    "return_token_ids/return_prompt_token_ids are not supported with "
                    "streaming. Please set stream=false.",
                    "BadRequestError",
                )
            )
        if (want_ids or want_prompt_ids) and self.tokenizer is None:
            raise _Invalid(
                self._error(
                    400,
                    "token ids need a tokenizer: start the simulator with --tokenizer DIR",
                    "BadRequestError",
                )
            )
        return body, stream

    async def _refuse(
        self,
        request: web.Request,
        body: dict[str, Any],
        fault: Fault | None,
        storm: bool,
        n_prompt: int,
        record: Callable[..., None],
    ) -> web.StreamResponse | None:
        """The answer of a request refused before any token (a drawn 500, 429 or 503, the
        storm, a full queue); None when it is admitted."""
        counters = self.stats.counters
        if fault is Fault.FAIL:
            counters.failed[fault.value] += 1
            record(status=500, fault=fault.value)
            return self._error(500, "simulated internal server error", "InternalServerError")
        if fault is Fault.RATE_LIMIT:
            counters.failed[fault.value] += 1
            record(status=429, fault=fault.value)
            retry = f"{self.config.faults.retry_after:g}"
            return self._error(
                429,
                "simulated rate limit: too many requests",
                "RateLimitError",
                **{"Retry-After": retry},
            )
        full = fault is None and self._queue_full()
        if fault is not Fault.OVERLOAD and not full:
            return None
        if full:  # the queue is full, refused before any token
            counters.queue_full += 1
            label = "queue_full"
        else:
            label = OVERLOAD_WINDOW if storm else Fault.OVERLOAD.value
            counters.failed[label] += 1
        record(status=503, fault=label)
        self.metrics.refused()
        d = self.dialect
        if body.get("stream"):
            return await self._stream_error(request, body, d.queue_full, n_prompt)
        return self._error(503, d.queue_full, d.queue_full_type)  # SGLang: str(status)

    def _admit(
        self,
        body: dict[str, Any],
        ans: SimAnswer,
        n_prompt: int,
        received_at: float,
        segments: list[Segment] | None,
    ) -> Job:
        """The request's job, in the scheduler (or made whole at once with --instant): the
        prefix cache's hit is looked up, and the prompt held, as it arrives."""
        job = Job(total=ans.completion_tokens, prompt=n_prompt)
        cache = self.cache
        if cache is not None and segments is not None:
            job.cached = cache.match(segments, n_prompt)
            cache.insert(segments)
            self.metrics.admitted(n_prompt, job.cached)
        else:
            self.metrics.admitted(n_prompt)
        if self.config.prefill_us_per_token:
            job.prefill = max(1, n_prompt - job.cached)
        if self.spec is not None:
            job.spec = self.spec.request(body)
            if self.config.instant:  # no step loop: its verify steps all at once
                self.spec.run_alone(job.spec, job.total)
        if self.config.instant:
            job.produced = job.total
            job.first_at = received_at
            self.scheduler.counters.tokens += job.total
            self.scheduler.tokens_total += job.total
        else:
            self.scheduler.submit(job)
        return job

    def _finished(
        self,
        *,
        ans: SimAnswer,
        job: Job,
        fault: Fault | None,
        usage: dict[str, Any],
        stream: bool,
        received_at: float,
        record: Callable[..., None],
        ids: TokenIds | None = None,
        segments: list[Segment] | None = None,
    ) -> None:
        """Count a full answer; called just before its last bytes are written, so a client
        that has read them finds it counted. The prefix cache now holds the prompt and the
        answer."""
        cache = self.cache
        if cache is not None and segments is not None:
            if ids is not None:
                cache.insert(token_segments(ids.prompt + ids.output, cache.block_size,
                                            salt_of(segments)))  # fmt: skip
            else:
                calls = [(c.name, c.arguments) for c in ans.tool_calls]
                tokens = usage["completion_tokens"] + GENERATION_PROMPT
                cache.insert(after_answer(segments, answer_segment(ans.content, calls, tokens)))
        c = self.stats.counters
        c.completed += 1
        c.stalled += fault is Fault.STALL
        c.prompt_tokens += usage["prompt_tokens"]
        c.completion_tokens += usage["completion_tokens"]
        record(
            status=200,
            fault=fault.value if fault else None,
            stream=stream,
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            finish_reason=ans.finish_reason,
        )
        self.metrics.finished(
            stream=stream,
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            finish_reason=ans.finish_reason,
            received_at=received_at,
            first_token_at=job.first_at,
            finished_at=time.monotonic(),
            cached_tokens=job.cached,
        )

    def _gone(self, request: web.Request, record: Callable[..., None]) -> None:
        """The client hung up before its answer ended: logged with the status its response
        had sent (200 once a stream's headers went out; null when nothing was sent)."""
        self.stats.counters.client_gone += 1
        self.metrics.aborted()
        record(status=request.get(SENT), fault=None, client_gone=True)

    async def _answer(
        self,
        body: dict[str, Any],
        key: str,
        attempt: int,
    ) -> tuple[SimAnswer, TokenIds | None, Fault | None, list[Segment] | None]:
        messages = body["messages"]
        tools = body.get("tools") or None
        tok = self.tokenizer
        cache = self.cache
        salt = body.get("cache_salt")
        salt = salt if isinstance(salt, str) and salt else None
        segments: list[Segment] | None = None
        if tok is not None:
            prompt_text = await asyncio.to_thread(tok.render_prompt, body)
            prompt_ids = tok.encode(prompt_text)
            n_prompt = len(prompt_ids)
            if cache is not None:
                segments = token_segments(prompt_ids, cache.block_size, salt)
        elif cache is not None:  # its tokens add up to the prompt's count
            segments = message_segments(messages, tools, salt)
            n_prompt = sum(t for _, t in segments)
        else:
            n_prompt = sim_prompt_tokens(messages, tools)
        max_tokens = requested_max_tokens(body)
        if max_tokens is not None and max_tokens < 0:
            raise _Invalid(self._error(400, "max_tokens must be >= 0", "BadRequestError"))
        self._context_check(n_prompt, max_tokens)
        fault = self.config.faults.decide(key, attempt)
        ans = answer(
            body,
            self.config.answer,
            default_max_tokens=self.config.context_length - n_prompt,
            prompt_tokens=n_prompt,
        )
        ids: TokenIds | None = None
        if tok is not None:
            ids = tok.token_ids(prompt_text, prompt_ids, ans, thinking_enabled(body))
        return ans, ids, fault, segments

    @staticmethod
    def _usage(
        ans: SimAnswer, ids: TokenIds | None, n_prompt: int, cached: int | None = None
    ) -> dict[str, Any]:
        """The usage object; ``cached``: the prompt's cached tokens, reported in
        ``prompt_tokens_details`` (None: not reported, the engines' default)."""
        completion = len(ids.output) if ids else ans.completion_tokens
        reasoning = ids.reasoning_tokens if ids else ans.reasoning_tokens
        return {
            "prompt_tokens": n_prompt,
            "completion_tokens": completion,
            "total_tokens": n_prompt + completion,
            "reasoning_tokens": reasoning,
            "prompt_tokens_details": None if cached is None else {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        }

    async def _until(self, job: Job, tokens: int) -> None:
        """Wait until ``job`` made ``tokens`` tokens and the server is not hung."""
        while job.produced < tokens and not job.done:
            await job.progress()
        await self.hang.wait_resumed()

    async def _complete(
        self,
        request: web.Request,
        body: Mapping[str, Any],
        ans: SimAnswer,
        ids: TokenIds | None,
        job: Job,
        fault: Fault | None,
        usage: dict[str, Any],
        done: Callable[[], None],
    ) -> web.StreamResponse:
        if fault is Fault.DISCONNECT:
            await self._until(job, job.total // 2)
            job.cancelled = True
            return await self._cut(request, b'{"id":"chatcmpl-cut","object":"chat.completion",')
        if fault is Fault.RETRACT:  # SGLang: HTTPException(503) once the request is aborted
            await self._until(job, job.total // 2)
            job.cancelled = True
            return self._error(503, RETRACTED, "503")
        if fault is Fault.ABORT:  # a graceful abort: HTTP 200, what was made, "abort"
            await self._until(job, job.total // 2)
            job.cancelled = True
            reasoning, content = _partial(ans, job.total // 2)
            message = {"role": "assistant", "content": content,
                       self.dialect.reasoning_key: reasoning or None}  # fmt: skip
            return web.Response(body=_dumps(self._whole(message, "abort", None, usage)),
                                content_type=_JSON)  # fmt: skip
        await self._until(job, job.total)
        if fault is Fault.STALL:
            await asyncio.sleep(self.config.faults.stall_s)
            await self.hang.wait_resumed()
        # SGLang's ChatMessage: content is "" (never null) when empty; tool_calls is left out
        # when there are none; reasoning_content is null when empty
        message: dict[str, Any] = {
            "role": "assistant",
            "content": ans.content or (None if self.dialect.null_empty_content else ""),
            self.dialect.reasoning_key: ans.reasoning or None,
        }
        if ans.tool_calls:
            message["tool_calls"] = [c.as_openai(i) for i, c in enumerate(ans.tool_calls)]
        if not body.get("separate_reasoning", True) and ans.reasoning:
            message["content"] = f"{ans.reasoning}</think>{ans.content}"
            message[self.dialect.reasoning_key] = None
        matched = IM_END_ID if ans.finish_reason == "stop" else None
        out = self._whole(message, ans.finish_reason, matched, usage)
        choice = out["choices"][0]
        want_prompt, want_output = self.dialect.asks_ids(body, False)
        if ids is not None and self.dialect.vllm_ids:  # vLLM: prompt at the top level
            if want_output:
                out["prompt_token_ids"] = ids.prompt
                choice["token_ids"] = ids.output
        elif ids is not None:  # SGLang puts both lists on the choice
            if want_prompt:
                choice["prompt_token_ids"] = ids.prompt
            if want_output:
                choice["response_token_ids"] = ids.output
        ext = self._sglext(body, job, None, usage)  # non-streamed: ids stay on the choice
        if ext:
            out["sglext"] = ext
        done()
        return web.Response(body=_dumps(out), content_type=_JSON)

    def _whole(
        self, message: dict[str, Any], finish: str, matched: int | None, usage: dict[str, Any]
    ) -> dict[str, Any]:
        """A non-streamed ``ChatCompletionResponse`` as SGLang serializes it."""
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": matched,
        }
        return {
            "id": f"chatcmpl-{os.urandom(8).hex()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.config.model_name,
            "choices": [choice],
            "usage": usage,
            "metadata": None,
        }

    def _sglext(
        self,
        body: Mapping[str, Any],
        job: Job,
        ids: TokenIds | None,
        usage: dict[str, Any],
    ) -> dict[str, Any]:
        """SGLang's extension object: the request's spec_tokens_details when asked (on a
        speculative server, once it had a verify step), and, for streams, the ids asked with
        return_{input,output}_ids_in_sglext (``ids``). vLLM has none."""
        ext: dict[str, Any] = {}
        if not self.dialect.sglext:
            return ext
        asked = body.get("return_spec_tokens_details") and self.config.spec_tokens_details
        if asked and self.spec is not None and job.spec is not None:
            details = self.spec.details(job.spec, usage["completion_tokens"])
            if details is not None:
                ext["spec_tokens_details"] = details
        if ids is not None:
            if body.get("return_input_ids_in_sglext"):
                ext["input_ids"] = ids.prompt
            if body.get("return_output_ids_in_sglext"):
                ext["output_ids"] = [ids.output]  # one list per choice
        return ext

    async def _stream_error(
        self, request: web.Request, body: Mapping[str, Any], message: str, n_prompt: int
    ) -> web.StreamResponse:
        """A streamed request SGLang aborts with 503 before its first token: HTTP 200, the error
        event, usage (when asked), [DONE]."""
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        out = [self.dialect.stream_error(message)]
        if (body.get("stream_options") or {}).get("include_usage"):
            out.append(self._usage_event(_zero_usage(n_prompt)))
        out.append(b"data: [DONE]\n\n")
        with contextlib.suppress(ConnectionError):
            await resp.write(b"".join(out))
            await resp.write_eof()
        return resp

    def _usage_event(self, usage: dict[str, Any]) -> bytes:
        cid = f"chatcmpl-{os.urandom(8).hex()}"
        return self._chunk_base(cid) + b',"choices":[],"usage":' + _dumps(usage) + b"}\n\n"

    async def _cut(self, request: web.Request, partial: bytes) -> web.StreamResponse:
        """Send ``partial`` then drop the connection (a stream cut mid-way)."""
        resp = web.StreamResponse(headers={"Content-Type": _JSON})
        resp.content_length = len(partial) + 4096  # promise more than we send
        await resp.prepare(request)
        await resp.write(partial)
        self._drop(request)
        return resp

    @staticmethod
    def _drop(request: web.Request) -> None:
        transport = request.transport
        if transport is not None:
            transport.abort()

    def _chunk_base(self, cid: str) -> bytes:
        """``data: {"id":..,"object":..,"created":..,"model":..`` of every chunk."""
        created = int(time.time())
        prefix = f'data: {{"id":"{cid}","object":"chat.completion.chunk","created":{created},'
        return prefix.encode() + b'"model":' + self.model_json

    async def _stream(
        self,
        request: web.Request,
        body: Mapping[str, Any],
        ans: SimAnswer,
        ids: TokenIds | None,
        job: Job,
        fault: Fault | None,
        usage: dict[str, Any],
        done: Callable[[], None],
    ) -> web.StreamResponse:
        base = self._chunk_base(f"chatcmpl-{os.urandom(8).hex()}")
        # vLLM's return_token_ids: each chunk carries the ids of its tokens
        vllm_ids = ids if self.dialect.vllm_ids and self.dialect.asks_ids(body, True)[1] else None
        separate = bool(body.get("separate_reasoning", True))
        chunks = _Chunker(base, self.dialect.reasoning_key, separate, ans, vllm_ids, job.total)
        # one chunk per step: K tokens, or what a speculative step can keep
        k = self.config.tokens_per_step if self.spec is None else self.spec.max_step_tokens

        # SGLang sends the status and headers with the first chunk, once the first token is
        # made (serving_chat.py _handle_streaming_request awaits the generator's first item);
        # vLLM returns its StreamingResponse at once, and Starlette sends the headers first
        while self.dialect.status_with_first_token and job.produced == 0 and not job.done:
            await job.progress()
        await self.hang.wait_resumed()
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        request[SENT] = 200

        async def write(data: bytes) -> None:
            if self.hang.hung:  # a hung server sends nothing more: the stream just stops
                await self.hang.wait_resumed()
            try:
                await resp.write(data)
            except ConnectionError:
                raise _ClientGone(resp) from None

        parts = chunks.role()
        sent = 0
        halfway = (Fault.DISCONNECT, Fault.STALL, Fault.RETRACT, Fault.ABORT)
        cut_at = job.total // 2 if fault in halfway else -1
        while True:
            produced = job.produced
            if cut_at >= 0 and produced >= cut_at:
                produced = max(sent, cut_at)
            if produced > sent:
                parts += chunks.text(sent, produced, k)
                if produced >= job.total and ans.tool_calls:
                    parts += _tool_chunks(chunks.head, chunks.tail, ans)
                sent = produced
            if parts:
                await write(b"".join(parts))
                parts = []
            if sent == cut_at:
                cut_at = -1
                if fault is Fault.DISCONNECT:
                    job.cancelled = True
                    self._drop(request)
                    return resp
                if fault in (Fault.RETRACT, Fault.ABORT):
                    job.cancelled = True
                    await write(self._stream_end(base, body, fault, sent, usage))
                    with contextlib.suppress(ConnectionError):
                        await resp.write_eof()
                    return resp
                await asyncio.sleep(self.config.faults.stall_s)
                continue
            if sent >= job.total:
                break
            await job.progress()

        done()
        await write(self._stream_last(base, body, ans, job, ids, usage, chunks.rest()))
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp

    def _stream_last(
        self,
        base: bytes,
        body: Mapping[str, Any],
        ans: SimAnswer,
        job: Job,
        ids: TokenIds | None,
        usage: dict[str, Any],
        rest_ids: list[int] | None,
    ) -> bytes:
        """A finished stream's last events: the finish chunk (vLLM's with the rest of the ids,
        ``rest_ids``: the tool section, <|im_end|>), SGLang's sglext chunk, usage when asked,
        [DONE]."""
        finish: dict[str, Any] = {
            "index": 0,
            "delta": {},
            "logprobs": None,
            "finish_reason": ans.finish_reason,
            "matched_stop": IM_END_ID if ans.finish_reason == "stop" else None,
        }
        if rest_ids is not None:
            del finish["matched_stop"]
            finish["stop_reason"] = None
            finish["token_ids"] = rest_ids
        last = b',"choices":[' + _dumps(finish) + b"]"
        if self.config.usage_shape == "finish":
            last += b',"usage":' + _dumps(usage)
        out = [base, last, b"}\n\n"]
        ext = self._sglext(body, job, ids, usage)
        if ext:  # SGLang: one chunk with choices [] after the finish chunk, before usage
            out += [base, b',"choices":[],"usage":null,"sglext":', _dumps(ext), b"}\n\n"]
        opts = body.get("stream_options") or {}
        if self.config.usage_shape == "sglang" and opts.get("include_usage"):
            out += [base, b',"choices":[],"usage":', _dumps(usage), b"}\n\n"]
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)

    def _stream_end(
        self, base: bytes, body: Mapping[str, Any], fault: Fault, sent: int, usage: dict[str, Any]
    ) -> bytes:
        """How SGLang ends a stream it aborted half-way: a retraction (503) as an error event,
        a graceful abort as a finish chunk with ``abort``; then usage (when asked), [DONE]."""
        if fault is Fault.RETRACT:
            out = [self.dialect.stream_error(RETRACTED)]
        else:
            finish = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "abort",
                      "matched_stop": None}  # fmt: skip
            out = [base, b',"choices":[', _dumps(finish), b"]}\n\n"]
        if (body.get("stream_options") or {}).get("include_usage"):
            part = {
                **usage,
                "completion_tokens": sent,
                "total_tokens": usage["prompt_tokens"] + sent,
            }
            out.append(self._usage_event(part))
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)


class _Chunker:
    """The text chunks of one streamed answer: one per step (K tokens) and channel, the
    reasoning under the dialect's key (or, not separated, as content closed by ``</think>``).
    With vLLM's ``return_token_ids`` (``ids``) each text chunk carries a proportional share of
    the answer's ids and the role chunk the prompt's; :meth:`rest` is what the finish chunk
    carries."""

    __slots__ = ("given", "head", "ids", "nr", "pieces", "r_key", "separate", "tail", "total")

    def __init__(
        self,
        base: bytes,
        reasoning_key: str,
        separate: bool,
        ans: SimAnswer,
        ids: TokenIds | None,
        total: int,
    ) -> None:
        self.head = base + b',"choices":[{"index":0,"delta":'
        self.tail = b',"logprobs":null,"finish_reason":null}]}\n\n'
        self.separate = separate
        self.r_key = f'{{"{reasoning_key}":'.encode() if separate else b'{"content":'
        self.pieces = ans.reasoning_pieces + ans.content_pieces
        self.nr = len(ans.reasoning_pieces)
        self.ids, self.total, self.given = ids, total, 0

    def role(self) -> list[bytes]:
        """The first chunk: the assistant's role (and vLLM's prompt ids)."""
        if self.ids is None:
            return [self.head, b'{"role":"assistant","content":""}', self.tail]
        return [self.head, b'{"role":"assistant","content":""}',
                b',"logprobs":null,"finish_reason":null}],"prompt_token_ids":',
                _dumps(self.ids.prompt), b"}\n\n"]  # fmt: skip

    def text(self, a: int, produced: int, k: int) -> list[bytes]:
        """The chunks of tokens ``a`` up to ``produced``, ``k`` per chunk."""
        out: list[bytes] = []
        pieces, nr, head = self.pieces, self.nr, self.head
        end = min(produced, len(pieces))
        while a < end:
            b = min(a + k, end)
            if a < nr:
                m = min(b, nr)
                text = pieces[a] if m - a == 1 else "".join(pieces[a:m])
                if not self.separate and m == nr:
                    text += "</think>"
                out += (head, self.r_key, _text_json(text), b"}", self._tail(m))
                a = m
            if b > a:
                text = pieces[a] if b - a == 1 else "".join(pieces[a:b])
                out += (head, b'{"content":', _text_json(text), b"}", self._tail(b))
            a = b
        return out

    def _tail(self, upto: int) -> bytes:
        if self.ids is None:
            return self.tail
        end = len(self.ids.output) * upto // max(1, self.total)
        part, self.given = self.ids.output[self.given : end], max(self.given, end)
        return b',"logprobs":null,"finish_reason":null,"token_ids":' + _dumps(part) + b"}]}\n\n"

    def rest(self) -> list[int] | None:
        """The answer's ids no chunk carried yet (vLLM: the finish chunk's)."""
        return None if self.ids is None else self.ids.output[self.given :]


def _tool_chunks(head: bytes, tail: bytes, ans: SimAnswer) -> list[bytes]:
    """The stream chunks of the answer's tool calls: each opens (id, name), then its
    arguments."""
    out: list[bytes] = []
    for i, call in enumerate(ans.tool_calls):
        opening = {"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                   "function": {"name": call.name, "arguments": ""}}]}  # fmt: skip
        args = {"tool_calls": [{"index": i, "function": {"arguments": call.arguments}}]}
        out += (head, _dumps(opening), tail, head, _dumps(args), tail)
    return out


def _partial(ans: SimAnswer, n: int) -> tuple[str, str]:
    """Reasoning and content of the first ``n`` tokens of an answer."""
    nr = len(ans.reasoning_pieces)
    return "".join(ans.reasoning_pieces[:n]), "".join(ans.content_pieces[: max(0, n - nr)])


def _zero_usage(n_prompt: int) -> dict[str, Any]:
    return {"prompt_tokens": n_prompt, "completion_tokens": 0, "total_tokens": n_prompt,
            "reasoning_tokens": 0, "prompt_tokens_details": None,
            "completion_tokens_details": None}  # fmt: skip


async def serve(config: SimConfig, *, ready: asyncio.Future[str] | None = None) -> None:
    """Run a simulated server until cancelled; logs (and writes ``ready_file``) the base URL."""
    server = SimServer(config)
    runner = web.AppRunner(
        server.app(),
        access_log=None,
        handle_signals=False,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        handler_cancellation=True,
    )
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, backlog=1024, reuse_address=True)
    await site.start()
    host, port = runner.addresses[0][:2]
    server.port = port
    server.serving()
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}"
    log.info("simulated SGLang server listening on %s (model %s)", url, config.model_name)
    if config.ready_file is not None:
        write_ready_file(config.ready_file, f"{url}/v1")  # what --endpoint takes
    if ready is not None and not ready.done():
        ready.set_result(url)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def write_ready_file(path: Path, url: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(url + "\n", encoding="utf-8")
    tmp.replace(path)
