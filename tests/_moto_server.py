"""moto's S3 server with S3's atomic conditional writes, for tests/_s3.py.

Amazon S3 evaluates ``If-None-Match: *`` and ``If-Match: ETAG`` on PutObject and DeleteObject
atomically with the write: of several racing conditional puts on one key, exactly one wins.
moto 5 checks the condition, then writes, with no lock between (``S3Response.put_object``
reads the key, compares, then calls the backend), and its server answers each request on its
own thread, so two racing takers of a stale lock can both see the old ETag and both succeed.
Run as ``python tests/_moto_server.py ARGS`` (the ``moto_server`` arguments): the conditional
write methods are serialised by one lock, which is what S3 guarantees; everything else is
moto's own server."""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

from moto.s3.responses import S3Response
from moto.server import main

_WRITE = threading.Lock()


def _atomic(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _WRITE:
            return method(*args, **kwargs)

    return wrapper


for _name in ("put_object", "delete_object"):
    setattr(S3Response, _name, _atomic(getattr(S3Response, _name)))

if __name__ == "__main__":
    main(sys.argv[1:])
