"""The Ray actor around :class:`regen.engine.worker.SampleWorker`. Owns no files.

An async actor: Ray runs its coroutine methods concurrently on one event loop, so many
``process`` calls are in flight at once while the worker's semaphore bounds the requests.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from regen.engine.schedule import PackedSample, unpacked
from regen.engine.worker import SampleOutcome, SampleWorker
from regen.manifest import Manifest
from regen.sample import Sample


def quiet_http_logs() -> None:
    """One INFO line per HTTP request would drown everything else."""
    for name in ("httpx", "httpx2", "httpcore", "openai"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))


class WorkerActor:
    """Ray actor body: one SampleWorker with its clients and router."""

    def __init__(
        self,
        manifest: Manifest,
        endpoints: list[Any],
        concurrency: int,
        log_level: str = "INFO",
        secrets: dict[str, str] | None = None,
        shares: dict[str, int] | None = None,
    ) -> None:
        logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
        quiet_http_logs()
        for name, value in (secrets or {}).items():  # API keys by env var name; never logged
            os.environ.setdefault(name, value)
        self.worker = SampleWorker(manifest, endpoints, concurrency, shares=shares)

    async def process(self, sample: Sample | PackedSample) -> SampleOutcome:
        return await self.worker.process(unpacked(sample))

    async def snapshot(self) -> dict[str, Any]:
        return self.worker.snapshot()

    async def close(self) -> None:
        await self.worker.aclose()


def actor_class(max_in_flight: int) -> Any:
    """The Ray remote class, accepting ``max_in_flight`` concurrent calls per actor."""
    import ray

    return ray.remote(num_cpus=0, max_concurrency=max_in_flight + 8, max_restarts=0)(WorkerActor)


#: concurrent calls an actor accepts (feed-ahead included; the adaptive limits stay below it)
MAX_CALLS_PER_ACTOR = 4096
