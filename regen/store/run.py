"""Opening a run directory: run.json, manifest.yaml and the fingerprint check.

Files written here (names and records in :mod:`regen.store.layout`): ``run.json``
(:class:`~regen.store.layout.RunRecord`) at creation, rewritten only by ``--force``;
``manifest.yaml``, the resolved manifest of the latest session (no secrets: keys come from
env vars/files, endpoint URLs are written without user:password), read back by
:func:`read_manifest` (validated) or :func:`read_manifest_data` (plain YAML data, for a reader
that needs one section). The lock is :mod:`regen.store.lock`.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping

import regen
from regen.core.errors import ConfigError, FingerprintMismatchError, RunDirError
from regen.manifest import (
    Manifest,
    changed_fields,
    flat_fields,
    load_yaml,
    parse_manifest,
    public_url,
)
from regen.store import layout
from regen.store.layout import EngineRecord, RunRecord
from regen.store.rundir import RunDir

log = logging.getLogger(__name__)


def new_session_id() -> str:
    """A sortable, unique session name: UTC time, then 6 random hex digits."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def prepare_run(
    rd: RunDir, manifest: Manifest, endpoints: list[str], *, force: bool = False
) -> RunRecord:
    """Create run.json or check the existing one's fingerprint; write manifest.yaml.

    Raises FingerprintMismatchError when the directory belongs to a different manifest, model,
    sampling or template, naming each field that changed with both values, unless ``force``
    (then run.json records the new fingerprint, and its ``settings`` the new settings id: every
    row says which settings made it). run.json's ``settings`` always holds this session's.
    """
    fp = manifest.fingerprint()
    info = layout.RUN_FILE.read(rd)
    dirty = info is None
    if info is not None and info.fingerprint != fp:
        changes = fingerprint_changes(rd, info, manifest)
        if not force:
            raise FingerprintMismatchError(
                f"{rd.uri} was made by a different manifest/model/sampling/template: {changes}; "
                "use a new --out directory, or --force to continue it anyway (each row records "
                "its settings id: `regen status` shows the mix, `regen export --setting ID` "
                "keeps one)"
            )
        log.warning("%s: fingerprint changed (%s); continuing (--force)", rd.uri, changes)
        info.previous_fingerprints.append(info.fingerprint)
        info.fingerprint = fp
        dirty = True
    elif info is None:
        info = RunRecord(
            name=manifest.name,
            fingerprint=fp,
            model=manifest.target.model,
            created_at=time.time(),
            regen_version=regen.__version__,
            endpoints=[public_url(u) for u in endpoints],
            render="objects",
            loop_cut=manifest.quality.loop_cut,
        )
    sid = manifest.settings_id()
    if sid not in info.settings:  # a run.json from before the record, or a new setting
        info.settings[sid] = flat_fields(manifest.settings_payload())
        dirty = True
    if dirty:
        layout.RUN_FILE.write(rd, info)
    write_manifest(rd, public_manifest(manifest))
    return info


def with_recorded_cut(rd: RunDir, info: RunRecord, manifest: Manifest) -> Manifest:
    """``manifest`` with the loop cut its run started with (run.json's ``loop_cut``, which
    prepare_run records when it creates the run): a session whose manifest says otherwise
    keeps the run's and says so once; a run.json from before the cut records none (no cut)."""
    if info.loop_cut == manifest.quality.loop_cut:
        return manifest
    log.warning("%s: this run started with quality.loop_cut %s and keeps it (this manifest "
                "says %s; a new run directory takes it)", rd.uri, dict(info.loop_cut),
                dict(manifest.quality.loop_cut))  # fmt: skip
    quality = manifest.quality.model_copy(update={"loop_cut": info.loop_cut})
    return manifest.model_copy(update={"quality": quality})


def fingerprint_changes(rd: RunDir, info: RunRecord, manifest: Manifest) -> str:
    """What differs between the manifest the run directory was bound to (its manifest.yaml,
    when that still has run.json's fingerprint) and ``manifest``: ``sampling.temperature 0.6
    -> 0.7; ...``; the two fingerprints when the recorded manifest cannot tell."""
    hashes = f"fingerprint {info.fingerprint}, this manifest {manifest.fingerprint()}"
    try:
        before = read_manifest(rd)
    except RunDirError as e:
        return f"{hashes} ({e})"
    if before is None or before.fingerprint() != info.fingerprint:
        return f"{hashes} (its {layout.MANIFEST} does not say more)"
    return describe_changes(changed_fields(before.fingerprint_payload(),
                                           manifest.fingerprint_payload()))  # fmt: skip


def describe_changes(changes: list[tuple[str, object, object]]) -> str:
    """``field old -> new`` per change (run directory's value, then this manifest's); a source
    only one side has is one entry (``sources.x: added``)."""
    out: list[str] = []
    whole: set[str] = set()
    for name, old, new in changes:
        if name.startswith("sources.") and name.endswith(".name") and (old is None or new is None):
            src = name[: -len(".name")]
            whole.add(src)
            out.append(f"{src}: {'added' if old is None else 'removed'}")
    for name, old, new in changes:
        if not any(name.startswith(f"{w}.") for w in whole):
            out.append(f"{name} {_show(old)} -> {_show(new)}")
    return "; ".join(out) + " (run directory -> this manifest)"


def _show(value: object) -> str:
    return (
        json.dumps(value, ensure_ascii=False) if not isinstance(value, int | float) else str(value)
    )


def record_engines(rd: RunDir, engines: Mapping[str, Mapping[str, object]]) -> RunRecord | None:
    """Merge what this session's endpoint check found (public URL -> EngineRecord fields) into
    run.json's ``engines``; written only when something changed. None when run.json is
    missing."""
    info = layout.RUN_FILE.read(rd)
    if info is None:
        return None
    merged = {**info.engines}
    for url, fields in engines.items():
        rec = EngineRecord.model_validate(fields)
        old = merged.get(url)
        if old is None or old.model_dump(exclude={"session"}) != rec.model_dump(
            exclude={"session"}
        ):
            merged[url] = rec
    if merged != info.engines:
        info.engines = merged
        layout.RUN_FILE.write(rd, info)
    return info


def public_manifest(manifest: Manifest) -> Manifest:
    """The manifest as it may be written down: endpoint URLs without user:password.

    Keys never are in a manifest (only the names of their env vars / files are).
    """
    eps = [e.model_copy(update={"url": public_url(e.url)}) for e in manifest.endpoints]
    return manifest.model_copy(update={"endpoints": eps})


def write_manifest(rd: RunDir, manifest: Manifest) -> None:
    """Replace ``manifest.yaml`` atomically (give it a :func:`public_manifest`)."""
    rd.write_text_atomic(layout.MANIFEST, manifest.to_yaml())


def read_manifest(rd: RunDir) -> Manifest | None:
    """``manifest.yaml`` as a Manifest; None when missing; RunDirError when it does not parse."""
    found, data = _manifest_document(rd)
    if not found:
        return None
    try:
        return parse_manifest(data, origin=f"{rd.uri}/{layout.MANIFEST}")
    except ConfigError as e:
        raise RunDirError(f"{layout.MANIFEST} is damaged: {e}") from None


def read_manifest_data(rd: RunDir) -> dict[str, object] | None:
    """``manifest.yaml`` as plain data, not validated (for a reader that needs one section
    and must not fail on the rest); None when missing or not a mapping; RunDirError when it is
    not YAML."""
    data = _manifest_document(rd)[1]
    return data if isinstance(data, dict) else None


def _manifest_document(rd: RunDir) -> tuple[bool, object]:
    """(whether ``manifest.yaml`` exists, its YAML document); RunDirError, one line, when it is
    not UTF-8 YAML."""
    text = rd.read_text(layout.MANIFEST)
    if text is None:
        return False, None
    try:
        return True, load_yaml(text, f"{layout.MANIFEST} is damaged")
    except ConfigError as e:
        raise RunDirError(str(e)) from None
