"""Opening a run directory: run.json, manifest.yaml, the fingerprint check and the lock.

Files owned here (see :mod:`regen.store` for the whole layout)::

    run.json       {name, fingerprint, model, created_at, regen_version, endpoints,
                    previous_fingerprints}   written at creation; rewritten only by --force
    manifest.yaml  the resolved manifest of the latest session (holds no secrets: keys come
                   from env vars/files, endpoint URLs are written without user:password)
    lock.json      {owner, host, pid, session, started_at, heartbeat_at}

A lock is live while its heartbeat is younger than :data:`LOCK_STALE_S` and, when it was taken
on this host, its pid still exists. A stale lock is taken over with a warning. The holder
refreshes ``heartbeat_at`` every :data:`HEARTBEAT_S` seconds from a daemon thread.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

import regen
from regen.errors import FingerprintMismatchError, LockHeldError
from regen.manifest import Manifest, public_url
from regen.store.rundir import RunDir

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
MANIFEST_FILE = "manifest.yaml"
LOCK_FILE = "lock.json"
#: a lock whose heartbeat is older than this is stale
LOCK_STALE_S = 30.0
#: seconds between heartbeats of a live run
HEARTBEAT_S = 5.0


def new_session_id() -> str:
    """A sortable, unique session name: UTC time, then 6 random hex digits."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def prepare_run(
    rd: RunDir, manifest: Manifest, endpoints: list[str], *, force: bool = False
) -> dict[str, Any]:
    """Create run.json or check the existing one's fingerprint; write manifest.yaml.

    Raises FingerprintMismatchError when the directory belongs to a different manifest, model,
    sampling or template, unless ``force`` (then run.json records the new fingerprint).
    """
    fp = manifest.fingerprint()
    info = rd.read_json(RUN_FILE)
    if info is not None and info.get("fingerprint") != fp:
        if not force:
            raise FingerprintMismatchError(
                f"{rd.uri} was made by a different manifest/model/sampling/template "
                f"(fingerprint {info.get('fingerprint')}, this manifest {fp}); "
                "use a new --out directory, or --force to continue it anyway"
            )
        log.warning("%s: fingerprint changed (%s -> %s); continuing (--force)", rd.uri,
                    info.get("fingerprint"), fp)  # fmt: skip
        info["previous_fingerprints"] = [*info.get("previous_fingerprints", []),
                                         info.get("fingerprint")]  # fmt: skip
        info["fingerprint"] = fp
        rd.write_json_atomic(RUN_FILE, info)
    elif info is None:
        info = {
            "name": manifest.name,
            "fingerprint": fp,
            "model": manifest.target.model,
            "created_at": time.time(),
            "regen_version": regen.__version__,
            "endpoints": [public_url(u) for u in endpoints],
        }
        rd.write_json_atomic(RUN_FILE, info)
    rd.write_text_atomic(MANIFEST_FILE, public_manifest(manifest).to_yaml())
    return info


def public_manifest(manifest: Manifest) -> Manifest:
    """The manifest as it may be written down: endpoint URLs without user:password.

    Keys never are in a manifest (only the names of their env vars / files are).
    """
    eps = [e.model_copy(update={"url": public_url(e.url)}) for e in manifest.endpoints]
    return manifest.model_copy(update={"endpoints": eps})


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):  # not a pid at all (a corrupt lock file)
        return False
    return True


def lock_is_live(lock: dict[str, Any], now: float | None = None) -> bool:
    """Whether the holder described by ``lock`` may still be running."""
    now = time.time() if now is None else now
    try:
        beat = float(lock.get("heartbeat_at", 0.0))
        pid = int(lock.get("pid", -1))
    except (TypeError, ValueError):
        return False
    if now - beat > LOCK_STALE_S:
        return False
    return not (lock.get("host") == socket.gethostname() and not pid_alive(pid))


class RunLock:
    """The lock of one session on a run directory, with a heartbeat thread."""

    def __init__(self, rd: RunDir, session: str, owner: str = "regen run") -> None:
        self.rd = rd
        self.session = session
        self.owner = owner
        self.started_at = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held = False

    def _record(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "session": self.session,
            "started_at": self.started_at,
            "heartbeat_at": time.time(),
        }

    def acquire(self) -> None:
        """Take the lock; LockHeldError when a live run holds it; take over a stale one."""
        cur = self.rd.read_json(LOCK_FILE)
        if cur is not None and cur.get("session") != self.session:
            if lock_is_live(cur):
                raise LockHeldError(
                    f"{self.rd.uri} is locked by a live run (host {cur.get('host')}, "
                    f"pid {cur.get('pid')}, heartbeat {time.time() - cur['heartbeat_at']:.0f} s "
                    "ago); stop it first, or wait until its lock is stale (30 s)"
                )
            log.warning("%s: taking over a stale lock (host %s, pid %s)", self.rd.uri,
                        cur.get("host"), cur.get("pid"))  # fmt: skip
        self.rd.write_json_atomic(LOCK_FILE, self._record())
        back = self.rd.read_json(LOCK_FILE)
        if back is None or back.get("session") != self.session:
            raise LockHeldError(f"{self.rd.uri}: another run took the lock at the same time")
        self._held = True

    def heartbeat(self) -> None:
        if self._held:
            self.rd.write_json_atomic(LOCK_FILE, self._record())

    def start_heartbeat(self, interval_s: float = HEARTBEAT_S) -> None:
        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.heartbeat()
                except Exception as e:  # a failed heartbeat must not kill the run
                    log.warning("lock heartbeat failed: %s", e)

        self._thread = threading.Thread(target=loop, name="regen-lock-heartbeat", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop the heartbeat and remove lock.json if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not self._held:
            return
        self._held = False
        cur = self.rd.read_json(LOCK_FILE)
        if cur is not None and cur.get("session") == self.session:
            self.rd.delete(LOCK_FILE)

    def __enter__(self) -> RunLock:
        self.acquire()
        self.start_heartbeat()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
