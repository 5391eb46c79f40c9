"""An SGLang server's ``/server_info`` (its launch arguments and internal states), as the
server checks of ``regen train``, ``regen bench`` and the serving commands read it. Owns no
files.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from regen.client.endpoints import server_root
from regen.core.errors import EndpointError


def fetch_server_info(
    url: str, *, timeout: float = 10.0, api_key: str | None = None
) -> dict[str, Any]:
    """GET /server_info, falling back to the old /get_server_info alias (``url``: root or /v1).

    ``api_key`` goes in ``Authorization: Bearer`` (a server started with ``--api-key`` wants it
    there); it is never put in an error.
    """
    base = server_root(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    last: Exception | None = None
    for path in ("/server_info", "/get_server_info"):
        try:
            req = urllib.request.Request(base + path, headers=headers)
            with urllib.request.urlopen(req, timeout=timeout) as r:
                info = json.loads(r.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            e.close()  # its response stays open while the error is held
            last = e
            if e.code == 404:
                continue
            if e.code in (401, 403):
                how = "a wrong key" if api_key else "no key (--api-key-env or --api-key-file)"
                raise EndpointError(
                    f"{base}{path}: HTTP {e.code}: the server wants an API key and regen sent {how}"
                ) from None
            raise EndpointError(f"{base}{path}: HTTP {e.code}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise EndpointError(f"{base}{path}: {e}") from None
        if not isinstance(info, dict):
            raise EndpointError(f"{base}{path}: not a JSON object")
        return info
    raise EndpointError(f"{base}: neither /server_info nor /get_server_info exists ({last})")
