"""Fail fast: everything deterministic an actor needs, checked once in the driver first.

Owns no files. Before Ray starts or any actor is created, :func:`preflight` checks, in this
order, and stops with one :class:`~regen.errors.ConfigError` line naming the manifest field and
the path:

1. every local source file exists (``sources.N.path``);
2. the tokenizer directory exists (``target.tokenizer``) and loads, with its chat template;
3. the chat template renders the first request of the first usable sample of every
   regenerated source (``target.tokenizer`` + the source).

A worker would otherwise hit each of these in its own ``__init__`` or first sample, be
respawned, and fail again: a configuration error reported as dying workers.
"""

from __future__ import annotations

import logging
from typing import Any

from regen.errors import ConfigError, RegenError, SourceError
from regen.manifest import Manifest
from regen.sample import Rejection, Sample

log = logging.getLogger(__name__)


def first_request(sample: Sample) -> list[dict[str, Any]]:
    """The messages of the first request a sample makes (see regen.engine.turns)."""
    msgs = sample.messages
    assistant = [i for i, m in enumerate(msgs) if m.role == "assistant"]
    if not assistant:
        end = len(msgs)
    elif sample.turns == "last":
        end = assistant[-1]
    else:
        end = assistant[0]
    return [m.to_openai() for m in msgs[:end]]


def check_paths(manifest: Manifest) -> None:
    """Local source files and the tokenizer directory exist."""
    for i, s in enumerate(manifest.sources):
        if s.path is not None:
            path = manifest.resolve(s.path)
            if not path.is_file():
                raise ConfigError(
                    f"sources.{i}.path: source file not found: {path} (source {s.name!r})",
                    field=f"sources.{i}.path",
                )
    tok = manifest.resolve(manifest.target.tokenizer)
    if not tok.is_dir():
        raise ConfigError(
            f"target.tokenizer: tokenizer directory not found: {tok}", field="target.tokenizer"
        )


def preflight(manifest: Manifest) -> None:
    """Check paths, load the tokenizer and render one request per regenerated source."""
    from regen.sources import iter_source
    from regen.template.render import KimiRenderer

    check_paths(manifest)
    tok = manifest.resolve(manifest.target.tokenizer)
    try:
        renderer = KimiRenderer.from_manifest(manifest)
    except RegenError as e:
        raise ConfigError(f"target.tokenizer: {tok}: {e}", field="target.tokenizer") from None
    for i, src in enumerate(manifest.sources):
        if src.mode != "regenerate":
            continue
        sample = None
        try:
            for item in iter_source(manifest, src):
                if not isinstance(item, Rejection):
                    sample = item
                    break
        except SourceError as e:
            raise ConfigError(str(e), field=f"sources.{i}") from None
        if sample is None:
            log.warning("source %r has no usable sample: nothing to check", src.name)
            continue
        try:
            renderer.render_prompt(first_request(sample), sample.tools)
        except RegenError as e:
            raise ConfigError(
                f"target.tokenizer: the chat template of {tok} cannot render source "
                f"{src.name!r} (sources.{i}), sample {sample.id}: {e}",
                field="target.tokenizer",
            ) from None
