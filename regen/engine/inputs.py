"""What a worker needs, typed: the one cut of the manifest below the driver. Owns no files.

The driver builds a :class:`WorkerConfig` once per session (:func:`worker_config`) from the
session's manifest, the endpoints the start check resolved
(:class:`regen.client.ResolvedEndpoint`) and the run's render setup; the pool hands it to every
actor, and the actor to its worker, the clients, the router and the row builder: none of them
sees the manifest. Every record here is frozen and pickles (Ray ships it to the actors).

:func:`render_settings` is the renderer's part of that cut, also what the fail-fast template
check renders with (:mod:`regen.engine.failfast`); :func:`row_settings` the row builder's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from regen.client import ClientSettings, ResolvedEndpoint, RetrySettings
from regen.manifest import Manifest
from regen.quality.config import QualityConfig
from regen.template.render import RenderSettings, RenderSetup


@dataclass(frozen=True, slots=True)
class RowSettings:
    """How a worker builds rows (regen.engine.rows): its renderer, the quality thresholds
    every turn is checked with (docs/quality.md) and the settings id every row records
    (``Manifest.settings_id``)."""

    render: RenderSettings
    quality: QualityConfig
    settings_id: str


@dataclass(frozen=True, slots=True)
class RoutingSettings:
    """The router's health rules (regen.engine.router): the consecutive failures that take an
    endpoint out of rotation, and the seconds between probes of one that is out."""

    failure_threshold: int = 5
    probe_interval_s: float = 15.0


@dataclass(frozen=True, slots=True)
class StallSettings:
    """The stall watch's timeout (None: derived per endpoint, never below ``min_s``;
    regen.engine.stall)."""

    timeout_s: float | None = None
    min_s: float = 30.0


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Everything one worker runs with (see the module docstring)."""

    endpoints: tuple[ResolvedEndpoint, ...]  #: the usable endpoints, in the manifest's order
    client: ClientSettings  #: what every request carries (model, sampling, ...)
    rows: RowSettings
    retry: RetrySettings = field(default_factory=RetrySettings)
    routing: RoutingSettings = field(default_factory=RoutingSettings)
    stall: StallSettings = field(default_factory=StallSettings)
    #: the user's cap on requests in flight per worker (None: automatic, regen.engine.adaptive)
    concurrency: int | None = None
    #: read the servers' /metrics pages (docs/metrics.md); False: regen's own counts only
    server_metrics: bool = True

    @property
    def seed(self) -> int | None:
        """The sampling seed (a new attempt derives its own from it: regen.plan.attempts)."""
        return self.client.sampling.seed


def render_settings(manifest: Manifest, setup: RenderSetup | None = None) -> RenderSettings:
    """The renderer a manifest asks for: its target tokenizer, the template the servers run
    (``target.chat_template``, else the tokenizer's), template kwargs and family (None where
    the target is of no known family), loaded and rendering as ``setup`` says."""
    return RenderSettings(
        tokenizer=manifest.resolve(manifest.target.tokenizer),
        family=manifest.family(),
        trust_remote_code=manifest.target.trust_remote_code,
        template_kwargs=manifest.template_kwargs(),
        chat_template=manifest.served_template(),
        setup=setup or RenderSetup(),
    )


def row_settings(manifest: Manifest, setup: RenderSetup | None = None) -> RowSettings:
    """How a run of ``manifest`` builds rows: its renderer (:func:`render_settings`), its
    quality thresholds and its settings id."""
    return RowSettings(
        render=render_settings(manifest, setup),
        quality=manifest.quality,
        settings_id=manifest.settings_id(),
    )


def worker_config(
    manifest: Manifest,
    endpoints: Sequence[ResolvedEndpoint],
    setup: RenderSetup | None = None,
) -> WorkerConfig:
    """The :class:`WorkerConfig` of a session: ``manifest`` as the session runs it (its
    ``engine`` section with the session's overrides), its usable ``endpoints`` and how the
    run renders (``setup``; None: :class:`RenderSetup`'s defaults)."""
    eng = manifest.engine
    return WorkerConfig(
        endpoints=tuple(endpoints),
        client=ClientSettings(
            model=manifest.target.model,
            sampling=manifest.sampling,
            timeout_s=eng.request_timeout_s,
            template_kwargs=manifest.template_kwargs(),
            request_fields=manifest.request_fields(),
            quality=manifest.quality,
        ),
        rows=row_settings(manifest, setup),
        retry=RetrySettings(eng.max_attempts, eng.backoff_initial_s, eng.backoff_max_s),
        routing=RoutingSettings(eng.endpoint_failure_threshold, eng.endpoint_probe_interval_s),
        stall=StallSettings(eng.stall_timeout_s, eng.stall_min_s),
        concurrency=eng.concurrency,
        server_metrics=eng.server_metrics,
    )
