"""Opening a run directory: run.json, manifest.yaml and the fingerprint check.

Files written here (names and records in :mod:`regen.store.layout`): ``run.json``
(:class:`~regen.store.layout.RunRecord`) at creation, rewritten only by ``--force``;
``manifest.yaml``, the resolved manifest of the latest session (no secrets: keys come from
env vars/files, endpoint URLs are written without user:password). The lock is
:mod:`regen.store.lock`.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import regen
from regen.errors import FingerprintMismatchError
from regen.manifest import Manifest, public_url
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
    sampling or template, unless ``force`` (then run.json records the new fingerprint).
    """
    fp = manifest.fingerprint()
    info = layout.RUN_FILE.read(rd)
    if info is not None and info.fingerprint != fp:
        if not force:
            raise FingerprintMismatchError(
                f"{rd.uri} was made by a different manifest/model/sampling/template "
                f"(fingerprint {info.fingerprint}, this manifest {fp}); "
                "use a new --out directory, or --force to continue it anyway"
            )
        log.warning("%s: fingerprint changed (%s -> %s); continuing (--force)", rd.uri,
                    info.fingerprint, fp)  # fmt: skip
        info.previous_fingerprints.append(info.fingerprint)
        info.fingerprint = fp
        layout.RUN_FILE.write(rd, info)
    elif info is None:
        info = RunRecord(
            name=manifest.name,
            fingerprint=fp,
            model=manifest.target.model,
            created_at=time.time(),
            regen_version=regen.__version__,
            endpoints=[public_url(u) for u in endpoints],
        )
        layout.RUN_FILE.write(rd, info)
    layout.write_manifest(rd, public_manifest(manifest))
    return info


def record_engines(rd: RunDir, engines: dict[str, dict[str, Any]]) -> RunRecord | None:
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
