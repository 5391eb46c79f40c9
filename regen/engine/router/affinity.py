"""Affinity: the endpoint each sample's turns go to, and the endpoints each sample avoids.

All turns of one sample go to the endpoint that served its first turn (its prefix cache),
unless that endpoint left rotation or cools; then the sample is rebound
(regen.engine.router.choice). A request that stalled on an endpoint, or was refused there as
overloaded, makes the sample avoid it while another is up. :meth:`Affinity.forget` drops both
when the sample is done, so memory stays bounded by the samples in flight.

Owns no files.
"""

from __future__ import annotations


class Affinity:
    """Per sample: the endpoint it is bound to and the endpoints it avoids."""

    def __init__(self) -> None:
        self._bound: dict[str, str] = {}
        self._avoid: dict[str, set[str]] = {}  #: sample -> endpoints its requests stalled on

    def bound(self, sample_id: str) -> str | None:
        """The endpoint the sample's turns go to (None: not bound yet)."""
        return self._bound.get(sample_id)

    def bind(self, sample_id: str, url: str) -> None:
        self._bound[sample_id] = url

    def avoided(self, sample_id: str) -> set[str]:
        """The endpoints the sample avoids (a copy)."""
        return set(self._avoid.get(sample_id, ()))

    def avoid(self, sample_id: str, url: str) -> None:
        """The sample avoids ``url`` from now on, and is no longer bound to it."""
        self._avoid.setdefault(sample_id, set()).add(url)
        if self._bound.get(sample_id) == url:
            del self._bound[sample_id]

    def forget(self, sample_id: str) -> None:
        """Drop a finished sample's binding and what it avoids."""
        self._bound.pop(sample_id, None)
        self._avoid.pop(sample_id, None)
