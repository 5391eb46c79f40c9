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

This module builds the application and runs a chat request through its stages; each stage is a
module of its own, over the server's one :class:`~regen.devkit.simulate.state.SimState`:
:mod:`.intake` (the body read, validated, the answer prepared), :mod:`.admission` (refused or
admitted, counted when it ends), :mod:`.complete` and :mod:`.streaming` (the answer sent, or cut
by its fault), :mod:`.info` (every other route), :mod:`.replies` (the pieces they share).
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from regen.core.errors import RegenError
from regen.devkit.simulate import admission
from regen.devkit.simulate.complete import complete
from regen.devkit.simulate.config import SimConfig
from regen.devkit.simulate.faults import Fault
from regen.devkit.simulate.info import InfoRoutes
from regen.devkit.simulate.intake import Prepared, prepare, read_request
from regen.devkit.simulate.keys import conversation_key, request_key
from regen.devkit.simulate.replies import JSON, ClientGone, Invalid, usage
from regen.devkit.simulate.state import SimState
from regen.devkit.simulate.streaming import AnswerStream
from regen.devkit.simulate.tokenized import AnswerTokenizer

log = logging.getLogger(__name__)

#: path prefixes that need no API key even with --api-key: SGLang's (utils/auth.py: health,
#: readiness, metrics) and the simulator's own test counters
OPEN_PREFIXES = ("/health", "/ready", "/metrics", "/stats")

#: seconds open requests get to finish when the server stops
SHUTDOWN_TIMEOUT_S = 0.5

#: the faults counted as failed when the request is admitted (their answer stops half-way)
COUNTED_UP_FRONT = (Fault.DISCONNECT, Fault.RETRACT, Fault.ABORT)


class SimServer:
    """One simulated server; ``app()`` builds its aiohttp application."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.state = SimState.build(config)
        self.info = InfoRoutes(self.state)

    @property
    def port(self) -> int:
        """The bound port once listening."""
        return self.state.port

    @port.setter
    def port(self, port: int) -> None:
        self.state.port = port

    # ---- lifecycle -------------------------------------------------------------------------

    def app(self) -> web.Application:
        middlewares = [self._check_key] if self.config.api_key else []
        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=middlewares)
        r, info, dialect = app.router, self.info, self.state.dialect
        r.add_get("/health", info.health)
        r.add_get("/health_generate", info.health_generate)
        r.add_get("/v1/models", info.models)
        if dialect.server_info:
            for path in ("/model_info", "/get_model_info"):
                r.add_get(path, info.model_info)
            for path in ("/server_info", "/get_server_info"):
                r.add_get(path, info.server_info)
        else:
            r.add_get("/version", info.version)
        if dialect.metrics_always or self.config.enable_metrics:
            r.add_get("/metrics", info.metrics_page)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_get("/stats", info.stats_view)
        r.add_post("/stats/reset", info.stats_reset)
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, _app: web.Application) -> None:
        s = self.state
        if self.config.tokenizer is not None:
            s.tokenizer = await asyncio.to_thread(
                AnswerTokenizer,
                self.config.tokenizer,
                self.config.tokenizer_class,
                s.dialect.name,
            )
        if not self.config.instant:
            s.scheduler.start()
        if s.background is not None:
            s.background.start()

    def serving(self) -> None:
        """The server listens: the outages' clocks start."""
        self.state.hang.serving()
        self.state.overload.serving()

    async def _cleanup(self, _app: web.Application) -> None:
        s = self.state
        s.hang.close()
        s.overload.close()
        if s.background is not None:
            await s.background.stop()
        await s.scheduler.stop()
        s.stats.close()

    @web.middleware
    async def _check_key(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """SGLang's --api-key: a wrong or missing bearer token is a 401 with SGLang's body
        ``{"error": "Unauthorized"}`` (open prefixes aside)."""
        if not request.path.startswith(OPEN_PREFIXES):
            want = f"Bearer {self.config.api_key}".encode()
            got = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(got, want):
                self.state.stats.counters.errors["401"] += 1
                return web.Response(status=401, body=b'{"error":"Unauthorized"}', content_type=JSON)
        return await handler(request)

    # ---- chat completions ------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions``: read, prepare, then admit and answer (:meth:`_serve`),
        each request-log line marked ``hung`` when a hang held the request."""
        s = self.state
        stats, hang = s.stats, s.hang
        received_at = time.monotonic()
        hang.request()  # the hang_after-th request starts the hang
        s.overload.request()  # ... and the overload_after-th the 503 storm
        hangs_before, hung_before = hang.count, hang.hung
        try:
            body, stream = await read_request(s, request)
        except Invalid as e:
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
            prepared = await prepare(s, body, key, attempt)
        except Invalid as e:  # answered by the HTTP layer, hung or not (as SGLang's)
            stats.counters.errors[str(e.response.status)] += 1
            record(status=e.response.status, fault=None)
            return e.response
        except RegenError as e:
            stats.counters.errors["500"] += 1
            return s.error(500, str(e), "InternalServerError")
        return await self._serve(request, body, stream, prepared, received_at, record)

    async def _serve(
        self,
        request: web.Request,
        body: dict[str, Any],
        stream: bool,
        prepared: Prepared,
        received_at: float,
        record: Callable[..., None],
    ) -> web.StreamResponse:
        """A prepared request once the server takes it in: refused (a drawn fault, the storm,
        a full queue) or admitted and answered; a client that hangs up is counted gone."""
        s = self.state
        ans, ids, fault, segments = prepared.ans, prepared.ids, prepared.fault, prepared.segments
        n_prompt = prepared.n_prompt
        try:  # a hung scheduler takes nothing in: the request waits, without a byte sent
            await s.hang.wait_resumed()
        except asyncio.CancelledError:
            admission.gone(s, request, record)
            raise
        storm = s.overload.active()
        if storm:  # a scheduled 503 storm refuses every new request as Fault.OVERLOAD does
            fault = Fault.OVERLOAD
        refused = await admission.refuse(s, request, body, fault, storm, n_prompt, record)
        if refused is not None:
            return refused
        job = admission.admit(s, body, ans, n_prompt, received_at, segments)
        use = usage(ans, ids, n_prompt, job.cached if self.config.enable_cache_report else None)
        done = functools.partial(admission.finished, s, ans=ans, job=job, fault=fault,
                                 usage=use, stream=stream, received_at=received_at,
                                 record=record, ids=ids, segments=segments)  # fmt: skip
        if fault in COUNTED_UP_FRONT:
            s.stats.counters.failed[fault.value] += 1
            s.metrics.aborted()
            status = 503 if fault is Fault.RETRACT and not stream else 200
            record(status=status, fault=fault.value)
        try:
            if stream:
                return await AnswerStream(s, request, body, ans, ids, job, fault, use).send(done)
            return await complete(s, request, body, ans, ids, job, fault, use, done)
        except (ClientGone, asyncio.CancelledError) as e:
            if stream:  # a closed stream: SGLang aborts it ~2 s later, vLLM at once
                s.scheduler.close(job, self.config.abort_delay)
            else:
                job.cancelled = True
            admission.gone(s, request, record)
            if isinstance(e, ClientGone):
                return e.response
            raise


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
