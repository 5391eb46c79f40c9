"""What unit tests hand a worker or a client: endpoints resolved as the start check would have
resolved them, and a :class:`regen.engine.inputs.WorkerConfig` cut from a manifest by the
driver's own function (:func:`regen.engine.inputs.worker_config`)."""

from __future__ import annotations

from dataclasses import replace

from regen.client import ChatClient, ResolvedEndpoint, RetryPolicy
from regen.client.profiles import profile_named
from regen.engine.inputs import WorkerConfig, worker_config
from regen.manifest import Manifest


def resolved(
    url: str,
    *,
    engine: str = "sglang",
    slots: int | None = None,
    queued: int | None = None,
    slots_source: str | None = None,
    weight: float = 1.0,
) -> ResolvedEndpoint:
    """An endpoint as the start check resolves one of ``engine`` (no key)."""
    return ResolvedEndpoint(url=url, profile=profile_named(engine), max_running_requests=slots,
                            max_queued_requests=queued, slots_source=slots_source,
                            weight=weight)  # fmt: skip


def config_for(
    manifest: Manifest,
    endpoints: list[ResolvedEndpoint] | None = None,
    **changes: object,
) -> WorkerConfig:
    """``manifest``'s worker config with ``endpoints`` (default: the manifest's, resolved as
    SGLang servers); ``changes``: fields of the config replaced (``concurrency=4``)."""
    eps = endpoints if endpoints is not None else [resolved(e.url) for e in manifest.endpoints]
    config = worker_config(manifest, eps)
    return replace(config, **changes) if changes else config  # type: ignore[arg-type]


def client_for(
    manifest: Manifest, url: str = "http://127.0.0.1:9/v1", *, engine: str = "sglang"
) -> ChatClient:
    """The client a run of ``manifest`` makes for an endpoint at ``url`` of ``engine``."""
    ep = resolved(url, engine=engine)
    config = worker_config(manifest, [ep])
    return ChatClient.of(ep, config.client, retry=RetryPolicy.of(config.retry))
