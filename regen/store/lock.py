"""The run directory's lock: one live session per directory, on local disks and object stores.

Files (names and records in :mod:`regen.store.layout`)::

    lock.json             LockRecord: the session holding the directory, its heartbeat
    lock.json.takeover    held (exclusive create) by the one session taking a stale lock
                          over, for that moment only (local and shared POSIX paths)

The lock is ``lock.json`` (:class:`regen.store.layout.LockRecord`). Its holder rewrites
``heartbeat_at`` every :data:`HEARTBEAT_S` seconds from a daemon thread; a lock is stale by the
one rule of :func:`why_gone` (heartbeat older than 30 s, or its pid gone on the same host), and
a stale lock is taken over with a warning.

Every change of the lock is a compare-and-swap on the version the changer read, so two
sessions can never both believe they hold it:

- **create** when there is no lock: an exclusive create;
- **take over** a stale lock, and every **heartbeat**: replace only if the file is still the
  version read (a heartbeat that finds another version means the lock was taken over while
  this session looked dead: the session is told and stops);
- **release**: delete only if the file is still ours.

How each store does it (:class:`LockStore`):

- local and shared POSIX paths (``/path``, ``file://``): the exclusive create is a hard link
  of a fully written temporary file (``link(2)`` fails when the name exists, also on NFS); a
  stale lock is taken over by the one session whose exclusive create of
  ``lock.json.takeover`` succeeded: it compares the version and renames its new lock over the
  file (never absent meanwhile), then removes the marker (one left by a taker that died is
  removed once older than the stale age); the version is a hash of the bytes, and a
  heartbeat compares it just before an atomic rename over the file;
- S3 (``s3://``; S3 has no rename): conditional writes through boto3: ``PutObject`` with
  ``If-None-Match: *`` creates, with ``If-Match: ETAG`` replaces, both atomic on the server
  (HTTP 412 when the condition fails). The client uses the run directory URI's
  ``endpoint_override``/``scheme``/``region`` and the standard AWS credential chain, as pyarrow
  does;
- any other pyarrow filesystem: write, then read back and compare (best effort).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from regen.core.errors import LockHeldError, RunDirError
from regen.store import layout
from regen.store.layout import LockRecord
from regen.store.rundir import TMP_PREFIX, RunDir

log = logging.getLogger(__name__)

# ---- the lock's one staleness rule ----------------------------------------------------------

#: a lock whose heartbeat is older than this is stale (its holder is gone)
LOCK_STALE_S = 30.0
#: seconds between heartbeats of a live run
HEARTBEAT_S = 5.0
#: extra allowance when the lock was written on another host than the reader's: heartbeat
#: times are the writer's clock, ``now`` the reader's (clock skew between hosts)
CLOCK_SKEW_S = 15.0


def why_gone(
    lock: LockRecord,
    now: float | None = None,
    *,
    hostname: str | None = None,
    pid_alive: Callable[[int], bool] | None = None,
) -> str:
    """Why the holder of ``lock`` is gone ("" while it may still run): the one staleness rule.

    Gone when the heartbeat is older than :data:`LOCK_STALE_S` (plus :data:`CLOCK_SKEW_S`
    when the lock was written on another host), or when it was written on this host and its
    pid no longer exists.
    """
    here = socket.gethostname() if hostname is None else hostname
    alive = pid_is_alive if pid_alive is None else pid_alive
    age = lock.age(now)
    if age > LOCK_STALE_S + (0.0 if lock.host == here else CLOCK_SKEW_S):
        return f"heartbeat {fmt_age(age)} old"
    if lock.host == here and not alive(lock.pid):
        return f"pid {lock.pid} is gone on {lock.host}"
    return ""


def fmt_age(seconds: float) -> str:
    """A short age: ``42 s``, ``12 min``, ``3 h 05 min``."""
    s = int(max(0, seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


def pid_is_alive(pid: int) -> bool:
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


class LockStore(Protocol):
    """Atomic operations on the lock file; a version is an opaque token (hash, ETag)."""

    def read(self) -> tuple[bytes, str] | None:
        """The lock's bytes and version, or None when there is no lock."""

    def create(self, data: bytes) -> str | None:
        """Create the lock if there is none; its version, or None when one exists."""

    def replace(self, data: bytes, version: str) -> str | None:
        """Replace our own lock if it is still ``version`` (a heartbeat); the new version, or
        None."""

    def take_over(self, data: bytes, version: str) -> str | None:
        """Replace a stale lock if it is still ``version``; the new version, or None when
        another session changed it first (exactly one of several takers wins)."""

    def delete(self, version: str) -> bool:
        """Delete the lock if it is still ``version``; whether it was deleted."""


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class LocalLockStore:
    """The lock on a local or shared POSIX filesystem."""

    def __init__(self, rd: RunDir) -> None:
        self.rd = rd
        self.path = rd.path(layout.LOCK)

    def read(self) -> tuple[bytes, str] | None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        return data, _digest(data)

    def _temp(self, data: bytes) -> str:
        tmp = f"{os.path.dirname(self.path)}/{TMP_PREFIX}{uuid.uuid4().hex[:8]}-lock"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    def create(self, data: bytes) -> str | None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = self._temp(data)
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            return None
        finally:
            os.unlink(tmp)
        return _digest(data)

    def replace(self, data: bytes, version: str) -> str | None:
        tmp = self._temp(data)
        try:
            cur = self.read()
            if cur is None or cur[1] != version:
                return None
            os.replace(tmp, self.path)
            tmp = ""
        finally:
            if tmp:
                os.unlink(tmp)
        return _digest(data)

    def take_over(self, data: bytes, version: str) -> str | None:
        # one taker at a time: the exclusive create of a marker; the lock file itself is never
        # absent (a session finding no lock would create one beside the taker's), and is
        # replaced atomically only if it is still the version judged stale
        marker = self.rd.path(layout.LOCK_TAKEOVER)
        tmp = self._temp(b"")
        try:
            os.link(tmp, marker)
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - os.stat(marker).st_mtime > LOCK_STALE_S:
                    os.unlink(marker)  # left by a taker that died: the next try may go
            return None
        finally:
            os.unlink(tmp)
        try:
            return self.replace(data, version)
        finally:
            os.unlink(marker)

    def delete(self, version: str) -> bool:
        cur = self.read()
        if cur is None or cur[1] != version:
            return False
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        return True


def s3_client_options(uri: str) -> dict[str, str]:
    """boto3 client options matching what pyarrow reads from an ``s3://`` URI's query
    (``endpoint_override``, ``scheme``, ``region``); credentials come from the standard AWS
    chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, profiles, instance roles)."""
    q = {k: v[-1] for k, v in parse_qs(urlsplit(uri).query).items()}
    opts: dict[str, str] = {}
    endpoint = q.get("endpoint_override")
    if endpoint:
        scheme = q.get("scheme", "https")
        opts["endpoint_url"] = endpoint if "://" in endpoint else f"{scheme}://{endpoint}"
    region = q.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    opts["region_name"] = region or "us-east-1"
    return opts


class S3LockStore:
    """The lock on S3: conditional PutObject (``If-None-Match`` / ``If-Match``)."""

    def __init__(self, rd: RunDir) -> None:
        try:
            import boto3
            from botocore.exceptions import ClientError
        except ImportError:
            raise RunDirError(
                f"{rd.uri}: an s3:// run directory needs boto3 for its lock (conditional "
                "writes): pip install 'regen[s3]'"
            ) from None
        self._error = ClientError
        bucket, _, prefix = rd.root.strip("/").partition("/")
        self.bucket = bucket
        self.key = f"{prefix}/{layout.LOCK}" if prefix else layout.LOCK
        self.client = boto3.client("s3", **s3_client_options(rd.uri))

    def _status(self, e: Exception) -> int:
        return int(getattr(e, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode", 0))

    def _conflict(self, e: Exception) -> bool:
        # 412: the condition failed; 409: a concurrent conditional write won the race;
        # 404: If-Match on a lock that is gone
        return self._status(e) in (404, 409, 412)

    def read(self) -> tuple[bytes, str] | None:
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except self._error as e:
            if self._status(e) == 404:
                return None
            raise RunDirError(f"cannot read the lock s3://{self.bucket}/{self.key}: {e}") from e
        return r["Body"].read(), r["ETag"]

    def _put(self, data: bytes, **cond: str) -> str | None:
        try:
            r = self.client.put_object(Bucket=self.bucket, Key=self.key, Body=data, **cond)
        except self._error as e:
            if self._conflict(e):
                return None
            raise RunDirError(f"cannot write the lock s3://{self.bucket}/{self.key}: {e}") from e
        etag: str = r["ETag"]
        return etag

    def create(self, data: bytes) -> str | None:
        return self._put(data, IfNoneMatch="*")

    def replace(self, data: bytes, version: str) -> str | None:
        return self._put(data, IfMatch=version)

    def take_over(self, data: bytes, version: str) -> str | None:
        return self._put(data, IfMatch=version)

    def delete(self, version: str) -> bool:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=version)
        except self._error as e:
            if self._conflict(e):
                return False
            raise RunDirError(f"cannot remove the lock s3://{self.bucket}/{self.key}: {e}") from e
        return True


class ReadBackLockStore:
    """Any other filesystem: atomic replace, then read back (no server-side condition)."""

    def __init__(self, rd: RunDir) -> None:
        self.rd = rd

    def read(self) -> tuple[bytes, str] | None:
        data = self.rd.read_bytes(layout.LOCK)
        return None if data is None else (data, _digest(data))

    def create(self, data: bytes) -> str | None:
        if self.rd.exists(layout.LOCK):
            return None
        return self._write(data)

    def replace(self, data: bytes, version: str) -> str | None:
        cur = self.read()
        if cur is None or cur[1] != version:
            return None
        return self._write(data)

    def take_over(self, data: bytes, version: str) -> str | None:
        return self.replace(data, version)

    def _write(self, data: bytes) -> str | None:
        self.rd.write_bytes_atomic(layout.LOCK, data)
        back = self.read()
        return back[1] if back is not None and back[0] == data else None

    def delete(self, version: str) -> bool:
        cur = self.read()
        if cur is None or cur[1] != version:
            return False
        self.rd.delete(layout.LOCK)
        return True


def lock_store(rd: RunDir) -> LockStore:
    """The lock store that fits the run directory's filesystem."""
    if rd.is_local:
        return LocalLockStore(rd)
    if rd.is_object_store and type(rd.fs).__name__ == "S3FileSystem":
        return S3LockStore(rd)
    return ReadBackLockStore(rd)


def _parse(data: bytes, level: int = logging.WARNING) -> LockRecord | None:
    try:
        return layout.LOCK_FILE.parse(data)
    except RunDirError as e:  # a torn or foreign lock file holds nobody
        log.log(level, "%s", e)
        return None


def read_lock(rd: RunDir) -> LockRecord | None:
    """The lock record (None when there is none or it is unreadable: a reader's question, so
    a damaged one is logged at debug level; ``regen verify`` names it)."""
    data = rd.read_bytes(layout.LOCK)
    return None if data is None else _parse(data, logging.DEBUG)


def lock_damage(rd: RunDir) -> str | None:
    """Why lock.json is not a lock record (None: absent or intact)."""
    data = rd.read_bytes(layout.LOCK)
    if data is None:
        return None
    try:
        layout.LOCK_FILE.parse(data)
    except RunDirError as e:
        return str(e)
    return None


class RunLock:
    """The lock of one session on a run directory, with a heartbeat thread."""

    def __init__(
        self,
        rd: RunDir,
        session: str,
        owner: str = "regen run",
        *,
        on_lost: Callable[[str], None] | None = None,
        store: LockStore | None = None,
    ) -> None:
        self.rd = rd
        self.session = session
        self.owner = owner
        self.started_at = time.time()
        self.on_lost = on_lost  #: called (from the heartbeat thread) when the lock was taken
        self.store = store or lock_store(rd)
        self._version: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    @property
    def held(self) -> bool:
        return self._version is not None

    def _record(self) -> bytes:
        rec = LockRecord(
            owner=self.owner,
            host=socket.gethostname(),
            pid=os.getpid(),
            session=self.session,
            started_at=self.started_at,
            heartbeat_at=time.time(),
        )
        return layout.dump_json(rec)

    def acquire(self) -> None:
        """Take the lock; LockHeldError when a live run holds it; take over a stale one."""
        for _ in range(3):
            cur = self.store.read()
            if cur is None:
                self._version = self.store.create(self._record())
            else:
                holder = _parse(cur[0])
                if holder is not None and holder.session != self.session:
                    why = why_gone(holder)
                    if not why:
                        raise LockHeldError(
                            f"{self.rd.uri} is locked by a live run (host {holder.host}, pid "
                            f"{holder.pid}, heartbeat {holder.age():.0f} s ago); stop it first, "
                            f"or wait until its lock is stale ({LOCK_STALE_S:.0f} s)"
                        )
                    log.warning(
                        "%s: taking over a stale lock (host %s, pid %s: %s)",
                        self.rd.uri,
                        holder.host,
                        holder.pid,
                        why,
                    )
                self._version = self.store.take_over(self._record(), cur[1])
            if self._version is not None:
                return
        raise LockHeldError(f"{self.rd.uri}: another run took the lock at the same time")

    def heartbeat(self) -> None:
        """Refresh ``heartbeat_at``; a lock taken over meanwhile is reported to ``on_lost``."""
        with self._mutex:
            if self._version is None:
                return
            new = self.store.replace(self._record(), self._version)
            if new is not None:
                self._version = new
                return
            self._version = None
        cur = read_lock(self.rd)
        who = f"session {cur.session} on {cur.host} (pid {cur.pid})" if cur else "nobody"
        msg = (
            f"{self.rd.uri}: this session's lock was taken over by {who} while its heartbeat "
            "was late; stopping so that two runs never write the same directory"
        )
        log.error("%s", msg)
        if self.on_lost is not None:
            self.on_lost(msg)

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
        """Stop the heartbeat and remove the lock if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._mutex:
            version, self._version = self._version, None
        if version is not None:
            try:
                self.store.delete(version)
            except Exception as e:  # a lock left behind goes stale by itself
                log.warning("could not remove the lock of %s: %s", self.rd.uri, e)

    def __enter__(self) -> RunLock:
        self.acquire()
        self.start_heartbeat()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
