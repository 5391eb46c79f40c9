"""Fail fast: everything deterministic an actor needs, checked once in the driver first.

Owns no files. Before the run directory is written, Ray starts or any actor is created,
:func:`check_run_dir` checks the run directory's path and :func:`preflight` checks, in this
order, and stops with one :class:`~regen.core.errors.ConfigError` line naming the manifest field and
the path:

1. every local source file exists (``sources.N.path``);
2. the tokenizer directory exists (``target.tokenizer``) and loads, with its chat template;
3. the chat template renders the first request of the first usable sample of every
   regenerated source (``target.tokenizer`` + the source).

A worker would otherwise hit each of these in its own ``__init__`` or first sample, be
respawned, and fail again: a configuration error reported as dying workers.

Loading the tokenizer imports transformers (and torch with it: ~4 CPU-s, most of a resume's
start). A session that passed 2 and 3 records :func:`checks_key` in the run directory
(``checks.json``, :class:`regen.store.layout.ChecksRecord`); a later session whose key is the
same (the same tokenizer files, target and template settings, regenerated sources and their
files, regen and transformers versions) checks only 1, and says so in one line. The record
also names the tokenizer's class as ``AutoTokenizer`` resolved it
(:func:`regen.template.tokenizer.class_spec`): the actors load that class directly, without
transformers' model config and torch.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from regen import __version__
from regen.core.errors import ConfigError, RegenError, SourceError
from regen.core.sample import Rejection, Sample, stable_hash
from regen.engine.inputs import render_settings
from regen.engine.turns import Request
from regen.manifest import Manifest
from regen.sources import iter_source, source_set
from regen.sources.locate import file_signature
from regen.store.layout import ChecksRecord
from regen.store.rundir import RunDir
from regen.template.render import Renderer
from regen.template.tokenizer import class_spec
from regen.template.tokenizer_classes import dir_signature, package_version

log = logging.getLogger(__name__)


def first_request(sample: Sample) -> Request:
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


def check_run_dir(rd: RunDir) -> None:
    """A local run directory's path can be a directory regen creates: no part of it is a file,
    and the deepest existing folder is writable (a URI is checked by its first write)."""
    if not rd.is_local:
        return
    path = Path(rd.root)
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        what = "is a file" if existing == path else f"is under a file ({existing})"
        raise ConfigError(f"--out {path} {what}, not a run directory", field="--out")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {path}: {existing} is not writable", field="--out")


def checks_key(manifest: Manifest) -> str:
    """A hash of what checks 2 and 3 depend on (stat calls only: no file is read whole)."""

    sources = []
    for s in manifest.sources:
        if s.mode != "regenerate":
            continue
        sig = None
        if s.path is not None:
            try:
                f = file_signature(manifest.resolve(s.path))
                sig = [f.size, f.mtime_ns, f.head_tail]
            except OSError:
                sig = None
        sources.append([s.model_dump(mode="json", exclude={"output_tokens"}), sig])
    return stable_hash(
        {
            "regen": __version__,
            "packages": [package_version(p) for p in ("transformers", "tokenizers", "jinja2")],
            "target": manifest.target.model_dump(mode="json"),
            "template_kwargs": manifest.template_kwargs(),
            "tokenizer_files": dir_signature(manifest.resolve(manifest.target.tokenizer)),
            "sources": sources,
        },
        n=32,
    )


def preflight(manifest: Manifest, *, passed: ChecksRecord | None = None) -> ChecksRecord:
    """Check paths, load the tokenizer and render one request per regenerated source; returns
    what passed: :func:`checks_key` and the tokenizer's class as AutoTokenizer resolved it.
    When ``passed`` (what an earlier session recorded) has that key, only the paths are
    checked, and ``passed`` is returned."""
    check_paths(manifest)
    check_family(manifest)
    key = checks_key(manifest)
    if passed is not None and passed.key == key:
        log.info("tokenizer and template checks passed in an earlier session with the same "
                 "files and settings: not repeated")  # fmt: skip
        return passed
    renderer = _check_template(manifest)
    return ChecksRecord(key=key, checked_at=time.time(),
                        tokenizer_class=class_spec(renderer.tokenizer))  # fmt: skip


def check_family(manifest: Manifest) -> None:
    """A target of no known family: refused when its rows would need the local render
    (``sampling.token_ids: local``), else said once, with what it cannot do."""
    if manifest.family() is not None:
        return
    if manifest.sampling.token_ids == "local":
        raise ConfigError(
            "target.family: the target's model family is unknown (docs/targets.md), so its "
            "answers cannot be rendered here; serve it with token ids (sampling.token_ids: "
            "stream or nonstream) or set target.family",
            field="target.family",
        )
    log.warning(
        "the target's model family is unknown (docs/targets.md): every row is the server's "
        "ids (token_check server_only, not cross-checked), sampling.thinking is not sent "
        "(set sampling.chat_template_kwargs), and reasoning_unclosed is told from truncation only"
    )


def _check_template(manifest: Manifest) -> Renderer:

    tok = manifest.resolve(manifest.target.tokenizer)
    try:
        renderer = Renderer.of(render_settings(manifest))
    except RegenError as e:
        raise ConfigError(f"target.tokenizer: {tok}: {e}", field="target.tokenizer") from None
    sources = source_set(manifest)
    for i, src in enumerate(sources.sources):
        if src.mode != "regenerate":
            continue
        sample = None
        try:
            for item in iter_source(sources, src):
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
    return renderer
