"""A real S3-compatible server for tests: moto's server mode on 127.0.0.1.

``moto_s3()`` starts moto's server (``tests/_moto_server.py``: ``moto_server`` with S3's atomic
conditional writes) on ``-H 127.0.0.1 -p PORT`` in its own process group, waits
until it answers, yields a :class:`MotoS3` (endpoint, credentials, run-directory URIs) and stops
the group at the end. pyarrow reaches it as ``s3://BUCKET/PREFIX?endpoint_override=127.0.0.1:
PORT&scheme=http&region=us-east-1`` with the standard ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` variables, which :meth:`MotoS3.env` gives for subprocesses and
:func:`moto_s3` sets in this process while it runs.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from regen.devkit.procs import stop_group

#: moto_server with S3's atomic conditional writes (moto checks, then writes, unlocked)
SERVER = Path(__file__).resolve().parent / "_moto_server.py"
#: seconds moto may take to answer
START_TIMEOUT_S = 30.0
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "regen-test",
    "AWS_SECRET_ACCESS_KEY": "regen-test-secret",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@dataclass(slots=True)
class MotoS3:
    endpoint: str  #: host:port

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        return {**(base if base is not None else os.environ), **CREDENTIALS}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=f"http://{self.endpoint}", region_name="us-east-1",
                            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip

    def bucket(self, name: str | None = None) -> str:
        name = name or f"regen-{uuid.uuid4().hex[:10]}"
        self.client().create_bucket(Bucket=name)
        return name

    def uri(self, bucket: str, prefix: str) -> str:
        return (f"s3://{bucket}/{prefix}?endpoint_override={self.endpoint}&scheme=http"
                "&region=us-east-1")  # fmt: skip

    def keys(self, bucket: str, prefix: str = "") -> dict[str, int]:
        """{key: size} under ``prefix``."""
        out: dict[str, int] = {}
        for page in (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        ):
            out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
        return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_s3() -> Iterator[MotoS3]:
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="regen-moto-") as tmp:
        log = Path(tmp) / "moto.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(SERVER), "-H", "127.0.0.1", "-p", str(port)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        saved = {k: os.environ.get(k) for k in CREDENTIALS}
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start: {log.read_text()[-2000:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2):
                        break
                except OSError:
                    time.sleep(0.1)
            os.environ.update(CREDENTIALS)
            yield MotoS3(f"127.0.0.1:{port}")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            stop_group(proc, 5)
