"""What one simulated server holds: its configuration, the models it runs (scheduler, prefix
cache, speculation, outages, background client), its counters and its /metrics page. Every
part of the server (regen.devkit.simulate.server and the modules of its routes) reads and
updates one :class:`SimState`. Owns no files (the request log is :mod:`.stats`').
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii

from aiohttp import web

from regen.devkit.simulate.background import BackgroundClient
from regen.devkit.simulate.config import SimConfig
from regen.devkit.simulate.dialect import DIALECTS, Dialect
from regen.devkit.simulate.metrics_page import SimMetrics
from regen.devkit.simulate.outage import Hang, OverloadWindow
from regen.devkit.simulate.prefix_cache import PrefixCache
from regen.devkit.simulate.replies import JSON, dumps
from regen.devkit.simulate.scheduler import Scheduler
from regen.devkit.simulate.speculative import SpecServer
from regen.devkit.simulate.stats import RequestStats
from regen.devkit.simulate.tokenized import AnswerTokenizer


@dataclass(slots=True, eq=False)
class SimState:
    """The state of one simulated server (:meth:`build` makes it from a configuration)."""

    config: SimConfig
    stats: RequestStats
    #: the speed model of a speculative server (None: a plain one)
    spec: SpecServer | None
    scheduler: Scheduler
    #: the prefix cache (None: --no-prefix-cache), regen.devkit.simulate.prefix_cache
    cache: PrefixCache | None
    #: the /metrics page (SGLang's or vLLM's names), over the live scheduler
    metrics: SimMetrics
    #: the other client of a shared server (None: this server has only HTTP clients)
    background: BackgroundClient | None
    #: a scheduled hang of the whole server (regen.devkit.simulate.outage)
    hang: Hang
    #: a scheduled 503 storm
    overload: OverloadWindow
    dialect: Dialect
    port: int  #: the bound port once listening
    model_json: bytes  #: the served model's name as a JSON string literal
    created: int = field(default_factory=lambda: int(time.time()))
    #: the answers' tokenizer (--tokenizer), loaded as the server starts
    tokenizer: AnswerTokenizer | None = None

    @classmethod
    def build(cls, config: SimConfig) -> SimState:
        stats = RequestStats(config.request_log)
        spec = config.speculation()
        scheduler = Scheduler(
            config.slots,
            config.step_s,
            config.tokens_per_step,
            spec=spec,
            prefill_s_per_token=config.prefill_us_per_token / 1e6,
            chunk=config.chunked_prefill_size,
        )
        cache = (
            PrefixCache(config.cache_tokens, config.cache_block_size)
            if config.prefix_cache
            else None
        )
        metrics = SimMetrics(config, scheduler, spec)
        background = (
            BackgroundClient(
                scheduler,
                metrics,
                requests=config.background_requests,
                max_tokens=config.background_max_tokens,
                prompt_tokens=config.background_prompt_tokens,
            )
            if config.background_requests and not config.instant
            else None
        )
        hang = Hang(
            None if config.instant else scheduler,
            metrics,
            at_s=config.hang_at_s,
            after=config.hang_after,
            for_s=config.hang_for_s,
        )
        overload = OverloadWindow(
            config.overload_at_s, config.overload_for_s, config.overload_after
        )
        model_json = encode_basestring_ascii(config.model_name).encode()
        return cls(config, stats, spec, scheduler, cache, metrics,
                   background, hang, overload, DIALECTS[config.engine], config.port,
                   model_json)  # fmt: skip

    @property
    def model_path(self) -> str:
        return self.config.model_path or self.config.model_name

    def error(
        self, status: int, message: str, err_type: str, param: str | None = None, **headers: str
    ) -> web.Response:
        """An error response in this dialect's body shape."""
        body = self.dialect.error_body(status, message, err_type, param)
        return web.Response(status=status, body=dumps(body), content_type=JSON, headers=headers)
