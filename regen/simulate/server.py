"""The simulated SGLang server: aiohttp handlers over the answer, capacity and fault models.

Endpoints: ``/health``, ``/health_generate``, ``/v1/models``, ``/model_info``
(+ ``/get_model_info``), ``/server_info`` (+ ``/get_server_info``), ``/v1/chat/completions``
(streaming and not),
``GET /stats`` (``?keys=1`` adds per-key and per-conversation request counts) and
``POST /stats/reset``. Owns no files except the optional request log (see :mod:`.stats`) and
the ready file (one line: the base URL, written atomically once listening).
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

from regen.errors import RegenError
from regen.simulate.answer import SimAnswer, answer, requested_max_tokens, thinking_enabled
from regen.simulate.config import SIM_VERSION, SimConfig
from regen.simulate.faults import Fault
from regen.simulate.keys import conversation_key, request_key
from regen.simulate.scheduler import Job, Scheduler
from regen.simulate.stats import RequestStats
from regen.simulate.tokenized import AnswerTokenizer, TokenIds
from regen.simulate.tokens import prompt_tokens as sim_prompt_tokens

log = logging.getLogger(__name__)

#: `<|im_end|>` in the Kimi vocabulary: what SGLang reports as matched_stop
IM_END_ID = 163586

_JSON = "application/json"

#: paths that need no API key even with --api-key (health checks, the test counters)
OPEN_PATHS = frozenset({"/health", "/health_generate", "/stats", "/stats/reset"})

#: seconds open requests get to finish when the server stops
SHUTDOWN_TIMEOUT_S = 0.5


@functools.lru_cache(maxsize=1 << 16)
def _text_json(text: str) -> bytes:
    """``text`` as a JSON string literal (cached: answers reuse a small set of pieces)."""
    return _enc(text).encode()


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def error_response(status: int, message: str, err_type: str, **headers: str) -> web.Response:
    """An error in the OpenAI/SGLang shape."""
    body = {"object": "error", "message": message, "type": err_type, "param": None, "code": status}
    return web.Response(status=status, body=_dumps(body), content_type=_JSON, headers=headers)


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
        self.scheduler = Scheduler(
            config.max_running_requests, config.step_s, config.tokens_per_step
        )
        self.tokenizer: AnswerTokenizer | None = None
        self.created = int(time.time())
        self.port = config.port  #: the bound port once listening
        self.model_json = _enc(config.model_name).encode()

    # ---- lifecycle -------------------------------------------------------------------------

    def app(self) -> web.Application:
        middlewares = [self._check_key] if self.config.api_key else []
        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=middlewares)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health_generate)
        r.add_get("/v1/models", self.models)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_get("/stats", self.stats_view)
        r.add_post("/stats/reset", self.stats_reset)
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, _app: web.Application) -> None:
        if self.config.tokenizer is not None:
            self.tokenizer = await asyncio.to_thread(AnswerTokenizer, self.config.tokenizer)
        if not self.config.instant:
            self.scheduler.start()

    async def _cleanup(self, _app: web.Application) -> None:
        await self.scheduler.stop()
        self.stats.close()

    @web.middleware
    async def _check_key(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """SGLang's --api-key: a wrong or missing bearer token is a 401 (open paths aside)."""
        if request.path not in OPEN_PATHS:
            want = f"Bearer {self.config.api_key}".encode()
            got = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(got, want):
                self.stats.counters.errors["401"] += 1
                return error_response(401, "Unauthorized", "AuthenticationError")
        return await handler(request)

    # ---- info endpoints --------------------------------------------------------------------

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def health_generate(self, _request: web.Request) -> web.Response:
        job = Job(total=1)
        if not self.config.instant:
            self.scheduler.submit(job)
            while not job.done:
                await job.progress()
        return web.Response(status=200)

    @property
    def model_path(self) -> str:
        return self.config.model_path or self.config.model_name

    async def models(self, _request: web.Request) -> web.Response:
        card = {
            "id": self.config.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "sglang",
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
            "tp_size": 8,
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
        c = self.config
        state: dict[str, Any] = {
            "last_gen_throughput": 0.0,
            "memory_usage": {},
            "num_running_reqs": self.scheduler.n_running,
            "num_queue_reqs": self.scheduler.n_queued,
        }
        if c.accept_length is not None:
            state["avg_spec_accept_length"] = c.accept_length
        info = {
            **self.server_args(),
            "internal_states": [state],
            "version": SIM_VERSION,
            "simulator": {
                "step_ms": c.step_ms,
                "tokens_per_step": c.tokens_per_step,
                "capacity_tok_s": c.capacity_tok_s,
                "instant": c.instant,
                "usage_shape": c.usage_shape,
                "answer": c.answer.model_dump(),
                "faults": c.faults.model_dump(mode="json"),
            },
        }
        return web.json_response(info)

    # ---- stats -----------------------------------------------------------------------------

    def stats_dict(self, with_keys: bool = False) -> dict[str, Any]:
        rc = self.stats.counters
        sc = self.scheduler.counters
        now = time.monotonic()
        cap = self.config.capacity_tok_s
        busy = sc.steps * self.config.step_s
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
            "steps": sc.steps,
            "late_steps": sc.late_steps,
            "busy_s": busy,
            "mean_batch_occupancy": (
                sc.slot_steps / (sc.steps * self.config.max_running_requests) if sc.steps else 0.0
            ),
            "capacity_tok_s": cap,
            "window_s": window,
            "utilization": sc.tokens / (cap * window) if window > 0 else 0.0,
            "uptime_s": now - self.stats.started,
        }
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
                error_response(400, "request body must be a JSON object", "BadRequestError")
            )
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _Invalid(
                error_response(400, "messages must be a non-empty list", "BadRequestError")
            )
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _Invalid(
                    error_response(400, f"messages[{i}] needs a string role", "BadRequestError")
                )
        model = body.get("model")
        if model not in (self.config.model_name, self.model_path):
            raise _Invalid(
                error_response(404, f"The model `{model}` does not exist.", "NotFoundError")
            )
        n = body.get("n")
        if n not in (None, 1):
            raise _Invalid(
                error_response(400, "the simulator supports n=1 only", "BadRequestError")
            )

    def _context_check(self, n_prompt: int, max_tokens: int | None) -> None:
        ctx = self.config.context_length
        if n_prompt >= ctx:
            msg = (
                f"The input ({n_prompt} tokens) is longer than the model's context length "
                f"({ctx} tokens)."
            )
            raise _Invalid(error_response(400, msg, "BadRequestError"))
        if max_tokens is not None and n_prompt + max_tokens > ctx:
            msg = (
                f"Requested token count exceeds the model's maximum context length of {ctx} "
                f"tokens. You requested a total of {n_prompt + max_tokens} tokens: {n_prompt} "
                f"tokens from the input messages and {max_tokens} tokens for the completion. "
                "Please reduce the number of tokens in the input messages or the completion to "
                "fit within the limit."
            )
            raise _Invalid(error_response(400, msg, "BadRequestError"))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        stats = self.stats
        try:
            raw = await request.read()
            try:
                body = json.loads(raw)
            except ValueError:
                raise _Invalid(
                    error_response(400, "request body is not valid JSON", "BadRequestError")
                ) from None
            self._validate(body)
            stream = bool(body.get("stream"))
            want_prompt_ids = bool(body.get("return_prompt_token_ids"))
            want_ids = bool(body.get("return_token_ids"))
            if (want_ids or want_prompt_ids) and stream:
                raise _Invalid(
                    error_response(
                        400,
                        "return_token_ids/return_prompt_token_ids are not supported with "
                        "streaming. Please set stream=false.",
                        "BadRequestError",
                    )
                )
            if (want_ids or want_prompt_ids) and self.tokenizer is None:
                raise _Invalid(
                    error_response(
                        400,
                        "token ids need a tokenizer: start the simulator with --tokenizer DIR",
                        "BadRequestError",
                    )
                )
        except _Invalid as e:
            stats.counters.received += 1
            stats.counters.errors[str(e.response.status)] += 1
            return e.response

        key = request_key(body)
        conv = conversation_key(body)
        attempt = stats.receive(key, conv)
        try:
            result = await self._answer(body, key, attempt)
        except _Invalid as e:
            stats.counters.errors[str(e.response.status)] += 1
            stats.record(
                key=key, conversation=conv, attempt=attempt, status=e.response.status, fault=None
            )
            return e.response
        except RegenError as e:
            stats.counters.errors["500"] += 1
            return error_response(500, str(e), "InternalServerError")
        ans, ids, fault = result
        n_prompt = len(ids.prompt) if ids else ans.prompt_tokens
        if fault is Fault.FAIL:
            stats.counters.failed[fault.value] += 1
            stats.record(key=key, conversation=conv, attempt=attempt, status=500, fault=fault.value)
            return error_response(500, "simulated internal server error", "InternalServerError")
        if fault is Fault.RATE_LIMIT:
            stats.counters.failed[fault.value] += 1
            stats.record(key=key, conversation=conv, attempt=attempt, status=429, fault=fault.value)
            retry = f"{self.config.faults.retry_after:g}"
            return error_response(
                429,
                "simulated rate limit: too many requests",
                "RateLimitError",
                **{"Retry-After": retry},
            )
        job = Job(total=ans.completion_tokens)
        if self.config.instant:
            job.produced = job.total
            self.scheduler.counters.tokens += job.total
        else:
            self.scheduler.submit(job)
        usage = self._usage(ans, ids, n_prompt)

        def done() -> None:
            """Count a full answer; called just before its last bytes are written, so a client
            that has read them finds it counted."""
            c = stats.counters
            c.completed += 1
            c.stalled += fault is Fault.STALL
            c.prompt_tokens += usage["prompt_tokens"]
            c.completion_tokens += usage["completion_tokens"]
            stats.record(
                key=key,
                conversation=conv,
                attempt=attempt,
                status=200,
                fault=fault.value if fault else None,
                stream=stream,
                prompt_tokens=usage["prompt_tokens"],
                completion_tokens=usage["completion_tokens"],
                finish_reason=ans.finish_reason,
            )

        if fault is Fault.DISCONNECT:  # counted up front: the client sees the cut at once
            stats.counters.failed[fault.value] += 1
            stats.record(key=key, conversation=conv, attempt=attempt, status=200, fault=fault.value)
        try:
            if stream:
                resp = await self._stream(request, body, ans, job, fault, usage, done)
            else:
                resp = await self._complete(request, body, ans, ids, job, fault, usage, done)
        except (_ClientGone, asyncio.CancelledError) as e:
            job.cancelled = True
            stats.counters.client_gone += 1
            stats.record(
                key=key,
                conversation=conv,
                attempt=attempt,
                status=200,
                fault=None,
                client_gone=True,
            )
            if isinstance(e, _ClientGone):
                return e.response
            raise
        return resp

    async def _answer(
        self,
        body: dict[str, Any],
        key: str,
        attempt: int,
    ) -> tuple[SimAnswer, TokenIds | None, Fault | None]:
        messages = body["messages"]
        tools = body.get("tools") or None
        tok = self.tokenizer
        if tok is not None:
            prompt_text = await asyncio.to_thread(tok.render_prompt, body)
            prompt_ids = tok.encode(prompt_text)
            n_prompt = len(prompt_ids)
        else:
            n_prompt = sim_prompt_tokens(messages, tools)
        max_tokens = requested_max_tokens(body)
        if max_tokens is not None and max_tokens < 0:
            raise _Invalid(error_response(400, "max_tokens must be >= 0", "BadRequestError"))
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
        return ans, ids, fault

    @staticmethod
    def _usage(ans: SimAnswer, ids: TokenIds | None, n_prompt: int) -> dict[str, Any]:
        completion = len(ids.output) if ids else ans.completion_tokens
        reasoning = ids.reasoning_tokens if ids else ans.reasoning_tokens
        return {
            "prompt_tokens": n_prompt,
            "completion_tokens": completion,
            "total_tokens": n_prompt + completion,
            "reasoning_tokens": reasoning,
            "prompt_tokens_details": None,
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        }

    async def _until(self, job: Job, tokens: int) -> None:
        while job.produced < tokens and not job.done:
            await job.progress()

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
        await self._until(job, job.total)
        if fault is Fault.STALL:
            await asyncio.sleep(self.config.faults.stall_s)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": ans.content if ans.content or not ans.tool_calls else None,
            "reasoning_content": ans.reasoning or None,
            "tool_calls": [c.as_openai(i) for i, c in enumerate(ans.tool_calls)] or None,
        }
        if not body.get("separate_reasoning", True) and ans.reasoning:
            message["content"] = f"{ans.reasoning}</think>{ans.content}"
            message["reasoning_content"] = None
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": ans.finish_reason,
            "matched_stop": IM_END_ID if ans.finish_reason == "stop" else None,
        }
        out: dict[str, Any] = {
            "id": f"chatcmpl-{os.urandom(8).hex()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.config.model_name,
            "choices": [choice],
            "usage": usage,
        }
        if ids is not None:
            if body.get("return_prompt_token_ids") or body.get("return_token_ids"):
                out["prompt_token_ids"] = ids.prompt
            if body.get("return_token_ids"):
                choice[self.config.token_ids_field] = ids.output
        done()
        return web.Response(body=_dumps(out), content_type=_JSON)

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
        job: Job,
        fault: Fault | None,
        usage: dict[str, Any],
        done: Callable[[], None],
    ) -> web.StreamResponse:
        cid = f"chatcmpl-{os.urandom(8).hex()}"
        base = self._chunk_base(cid)
        head = base + b',"choices":[{"index":0,"delta":'
        tail = b',"logprobs":null,"finish_reason":null}]}\n\n'
        separate = bool(body.get("separate_reasoning", True))
        r_key = b'{"reasoning_content":' if separate else b'{"content":'
        c_key = b'{"content":'
        pieces = ans.reasoning_pieces + ans.content_pieces
        nr = len(ans.reasoning_pieces)
        text_end = len(pieces)
        k = self.config.tokens_per_step

        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)

        async def write(data: bytes) -> None:
            try:
                await resp.write(data)
            except ConnectionError:
                raise _ClientGone(resp) from None

        parts = [head, b'{"role":"assistant","content":""}', tail]
        sent = 0
        cut_at = job.total // 2 if fault in (Fault.DISCONNECT, Fault.STALL) else -1
        while True:
            produced = job.produced
            if cut_at >= 0 and produced >= cut_at:
                produced = max(sent, cut_at)
            if produced > sent:
                a, end = sent, min(produced, text_end)
                while a < end:  # one chunk per step (K tokens) and channel
                    b = min(a + k, end)
                    if a < nr:
                        m = min(b, nr)
                        text = pieces[a] if m - a == 1 else "".join(pieces[a:m])
                        if not separate and m == nr:
                            text += "</think>"
                        parts += (head, r_key, _text_json(text), b"}", tail)
                        a = m
                    if b > a:
                        text = pieces[a] if b - a == 1 else "".join(pieces[a:b])
                        parts += (head, c_key, _text_json(text), b"}", tail)
                    a = b
                if produced >= job.total and ans.tool_calls:
                    for i, call in enumerate(ans.tool_calls):
                        opening = {
                            "tool_calls": [
                                {
                                    "index": i,
                                    "id": call.id,
                                    "type": "function",
                                    "function": {"name": call.name, "arguments": ""},
                                }
                            ]
                        }
                        args = {
                            "tool_calls": [{"index": i, "function": {"arguments": call.arguments}}]
                        }
                        parts += (head, _dumps(opening), tail, head, _dumps(args), tail)
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
                await asyncio.sleep(self.config.faults.stall_s)
                continue
            if sent >= job.total:
                break
            await job.progress()

        finish = {
            "index": 0,
            "delta": {},
            "logprobs": None,
            "finish_reason": ans.finish_reason,
            "matched_stop": IM_END_ID if ans.finish_reason == "stop" else None,
        }
        last = b',"choices":[' + _dumps(finish) + b"]"
        if self.config.usage_shape == "finish":
            last += b',"usage":' + _dumps(usage)
        out = [base, last, b"}\n\n"]
        opts = body.get("stream_options") or {}
        if self.config.usage_shape == "sglang" and opts.get("include_usage"):
            out += [base, b',"choices":[],"usage":', _dumps(usage), b"}\n\n"]
        out.append(b"data: [DONE]\n\n")
        done()
        await write(b"".join(out))
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp


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
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}"
    log.info("simulated SGLang server listening on %s (model %s)", url, config.model_name)
    if config.ready_file is not None:
        write_ready_file(config.ready_file, url)
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
