"""An endpoint as a run's workers use it, resolved once: its URL, where its API key is read
from, the engine the start check recognised, its batch slots and its weight. Owns no files.

:class:`KeySource` names where a key is read (an environment variable, or a file made absolute
against the manifest's folder), never the key: the key is read where a request is sent
(:meth:`KeySource.read`), sent as a bearer token and never logged nor put in an error.
:class:`ResolvedEndpoint` is made by the start check (:meth:`regen.client.EndpointInfo.resolved`)
from the manifest's :class:`regen.manifest.Endpoint` and what the server said; it pickles, so
the driver hands it to the Ray actors as it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from regen.client.profiles import EngineProfile
from regen.core.errors import ConfigError
from regen.manifest import Endpoint, public_url

#: what :func:`resolve_api_key` returns for an endpoint that names no key (nothing is sent)
NO_KEY = ""


@dataclass(frozen=True, slots=True)
class KeySource:
    """Where an endpoint's API key is read from (None, None: it has none)."""

    env: str | None = None  #: the environment variable holding it (wins over ``file``)
    file: Path | None = None  #: the file holding it (absolute, or relative to the cwd)

    @classmethod
    def of(cls, endpoint: Endpoint, base_dir: str | Path = ".") -> KeySource:
        """The key source a manifest's endpoint names; its file relative to ``base_dir`` (the
        manifest's folder)."""
        file = None
        if endpoint.api_key_file:
            p = Path(endpoint.api_key_file).expanduser()
            file = p if p.is_absolute() else Path(base_dir) / p
        return cls(endpoint.api_key_env or None, file)

    def read(self, shown: str) -> str:
        """The key (:data:`NO_KEY` when none is named); a ConfigError naming the endpoint
        ``shown`` (its public URL) when it cannot be read."""
        if self.env:
            value = os.environ.get(self.env)
            if not value:
                raise ConfigError(
                    f"endpoint {shown}: environment variable {self.env} (api_key_env) is not set",
                    field="endpoints.api_key_env",
                )
            return value.strip()
        if self.file is not None:
            try:
                value = self.file.read_text(encoding="utf-8").strip()
            except OSError as e:
                raise ConfigError(
                    f"endpoint {shown}: cannot read api_key_file {self.file}: {e.strerror or e}",
                    field="endpoints.api_key_file",
                ) from None
            if not value:
                raise ConfigError(
                    f"endpoint {shown}: api_key_file {self.file} is empty",
                    field="endpoints.api_key_file",
                )
            return value
        return NO_KEY


def resolve_api_key(endpoint: Endpoint, base_dir: str | Path = ".") -> str:
    """The endpoint's key from its env var or file; :data:`NO_KEY` when it names neither."""
    return KeySource.of(endpoint, base_dir).read(public_url(endpoint.url))


def auth_headers(key: str) -> dict[str, str]:
    """``Authorization: Bearer KEY``, or nothing for :data:`NO_KEY`."""
    return {"Authorization": f"Bearer {key}"} if key else {}


@dataclass(frozen=True, slots=True)
class ResolvedEndpoint:
    """One usable endpoint of a run (see the module docstring)."""

    url: str  #: base URL including /v1, as configured (regen writes :func:`public_url` of it)
    profile: EngineProfile  #: the engine the start check recognised (regen.client.profiles)
    key: KeySource = field(default_factory=KeySource)
    version: str | None = None  #: the engine's version as the server reported it
    #: the server's batch slots (None: not reported): what sizes the in-flight limits
    max_running_requests: int | None = None
    weight: float = 1.0  #: relative share of traffic when routing
    #: which server value gave the slots (regen.client.endpoints.EndpointInfo.slots_source)
    slots_source: str | None = None
    #: requests the server's queue holds before it refuses (None: not reported)
    max_queued_requests: int | None = None

    @property
    def public(self) -> str:
        """The URL without user:password: the only form regen writes or logs."""
        return public_url(self.url)

    def headers(self) -> dict[str, str]:
        """The request headers of its key (``{}`` without one); ConfigError when it cannot be
        read."""
        return auth_headers(self.key.read(self.public))
