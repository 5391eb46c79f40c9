"""Map a failed request to the regen error taxonomy, by exception type and HTTP status only.

The rules (message text is never read):

- connection refused / reset before any stream chunk arrived → ``ConnectError``;
  the connection dropping after chunks arrived → ``StreamCutError``;
- any timeout (connect, read stall, our own deadline) → ``RequestTimeoutError``;
- 503 → ``OverloadedError``: SGLang's answer to a full queue (``--max-queued-requests``), a
  request that waited or ran past its timeout, and a retraction under memory pressure; it
  never sends 429 nor Retry-After (a Retry-After is kept when some other server sends one);
- 429 → ``RateLimitedError`` (an ``OverloadedError``; gateways send it) with ``retry_after``
  from the Retry-After header (seconds or an HTTP date; ``retry-after-ms`` also read);
- 408 and the other 5xx → ``ServerError`` (Retry-After kept when sent);
- 401, 403, 404, 405, 407 → ``EndpointFaultError``: about the endpoint, never the sample (a
  missing or wrong key, a gateway that refuses, a model the server does not serve, a URL
  without ``/v1``); it carries what to fix and an excerpt of the body;
- 413, or 400 whose structured error ``code``/``type`` is ``context_length_exceeded`` →
  ``ContextLengthError``; every other 4xx (400, 409, 422, ...) → ``PermanentError``. SGLang
  reports an over-long prompt as a plain 400 ``BadRequestError`` whose only hint is the message
  text, so there it is a ``PermanentError``: it is recorded with the server's message and not
  retried either way;
- an error object sent inside a stream after HTTP 200 (SGLang: ``data: {"error": {...,
  "code": 503}}`` when a streamed request is aborted with a status) → classified by its integer
  ``code`` when that is an HTTP status, else ``ServerError`` (the server failed mid-generation).

Error messages carry the endpoint URL and the server's own message, never the API key.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping

from regen.core.errors import (
    ConnectError,
    ContextLengthError,
    EndpointFaultError,
    NotProtocolError,
    OverloadedError,
    PermanentError,
    RateLimitedError,
    RegenError,
    RequestError,
    RequestTimeoutError,
    ServerError,
    StreamCutError,
)

#: structured error codes/types that mean "the prompt does not fit the context"
CONTEXT_LENGTH_CODES = frozenset({"context_length_exceeded", "context_window_exceeded"})

#: statuses about the endpoint, never the sample, and what to fix for each
ENDPOINT_FAULTS: dict[int, str] = {
    401: "the server wants an API key and refused the one sent (or none): set the endpoint's "
    "api_key_env / api_key_file (--api-key-env / --api-key-file)",
    403: "the key or this client is not allowed (a gateway's rule, a revoked or rotated key): "
    "check the key and the gateway",
    404: "the server does not serve this model or path: check target.model against its "
    "GET /v1/models and that the endpoint URL ends with /v1",
    405: "the URL does not point at an OpenAI-compatible API (check that it ends with /v1)",
    407: "a proxy wants authentication: configure the proxy or bypass it",
}
#: characters of a body shown with an endpoint fault
EXCERPT_CHARS = 160


def excerpt(text: str, n: int = EXCERPT_CHARS) -> str:
    """The start of a body on one line (whitespace collapsed), at most ``n`` characters."""
    one = " ".join(text.split())
    return one if len(one) <= n else one[: n - 1] + "…"


def url_hint(endpoint: str | None) -> str:
    """A hint when an endpoint URL lacks the ``/v1`` of the OpenAI API ("" otherwise)."""
    if endpoint and not endpoint.rstrip("/").endswith("/v1"):
        return f" (the URL has no /v1: try {endpoint.rstrip('/')}/v1)"
    return ""


def not_protocol(
    endpoint: str | None, what: str, content_type: str, body: bytes | str
) -> NotProtocolError:
    """The :class:`NotProtocolError` of an answer that is not the protocol: ``what`` came back
    with ``content_type``; the message shows an excerpt of ``body``."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    shown = excerpt(text)
    return NotProtocolError(
        f"{endpoint} answered {what} (Content-Type {content_type or 'none'!r}), not the OpenAI "
        f"chat protocol: {shown!r}",
        fix="check the endpoint URL: something other than the model server (a gateway's or "
        "proxy's page?) answers there" + url_hint(endpoint),
        excerpt=shown,
        endpoint=endpoint,
    )


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``retry-after-ms`` or ``Retry-After`` header (seconds or HTTP date).

    ``now`` is the current Unix time (injectable for tests). Returns None when absent/unparsable.
    """
    if not headers:
        return None
    ms = _header(headers, "retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    raw = _header(headers, "retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    ref = time.time() if now is None else now
    return max(0.0, when.timestamp() - ref)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    get = getattr(headers, "get", None)
    if get is None:
        return None
    value: str | None = get(name)
    if value is None:
        # plain dicts are case-sensitive
        for k, v in headers.items():
            if k.lower() == name:
                return v
    return value


def status_error(
    status: int,
    message: str,
    *,
    endpoint: str | None,
    headers: Mapping[str, str] | None = None,
    body: object = None,
    now: float | None = None,
) -> RequestError:
    """The taxonomy class for an HTTP error status (see the module docstring for the rules)."""
    text = f"HTTP {status} from {endpoint}: {message}"
    if status in ENDPOINT_FAULTS:
        fix = ENDPOINT_FAULTS[status] + (url_hint(endpoint) if status in (404, 405) else "")
        return EndpointFaultError(
            f"HTTP {status} from {endpoint}: {excerpt(message)!r}",
            fix=fix,
            excerpt=excerpt(message),
            status=status,
            endpoint=endpoint,
        )
    if status == 429:
        return RateLimitedError(
            text, retry_after=parse_retry_after(headers, now), status=status, endpoint=endpoint
        )
    if status == 503:
        return OverloadedError(
            text, retry_after=parse_retry_after(headers, now), status=status, endpoint=endpoint
        )
    if status == 408 or status >= 500:
        return ServerError(
            text, retry_after=parse_retry_after(headers, now), status=status, endpoint=endpoint
        )
    if status == 413 or (status == 400 and _is_context_length(body)):
        return ContextLengthError(text, status=status, endpoint=endpoint)
    return PermanentError(text, status=status, endpoint=endpoint)


def _is_context_length(body: object) -> bool:
    if not isinstance(body, Mapping):
        return False
    error = body.get("error")
    inner = error if isinstance(error, Mapping) else body
    for key in ("code", "type"):
        value = inner.get(key)
        if isinstance(value, str) and value.lower() in CONTEXT_LENGTH_CODES:
            return True
    return False


def body_message(body: object, fallback: str) -> str:
    """The server's own message in an error body (OpenAI / SGLang shapes), at most 500 chars."""
    if isinstance(body, Mapping):
        error = body.get("error")
        inner = error if isinstance(error, Mapping) else body
        for key in ("message", "detail", "error"):  # SGLang's 401: {"error": "Unauthorized"}
            value = inner.get(key)
            if isinstance(value, str) and value:
                return value[:500]
    if isinstance(body, str) and body:
        return body[:500]
    return fallback[:500]


def map_error(
    exc: BaseException,
    *,
    endpoint: str | None,
    received: bool = False,
) -> RegenError:
    """Translate an exception raised while calling ``endpoint`` into the regen taxonomy.

    ``received`` says whether stream chunks had already arrived (a drop then is a stream cut).
    A RegenError passes through unchanged; an exception this module does not know is returned
    as a ``PermanentError`` naming its type (a bug or an unexpected response, not worth a retry).
    """
    import aiohttp

    if isinstance(exc, RegenError):
        return exc
    if isinstance(exc, aiohttp.ClientResponseError):
        return status_error(exc.status, exc.message, endpoint=endpoint, headers=exc.headers)
    if isinstance(exc, TimeoutError):  # aiohttp's ServerTimeoutError is one too
        return RequestTimeoutError(f"request to {endpoint} timed out", endpoint=endpoint)
    if isinstance(exc, aiohttp.ClientError | ConnectionError):
        what = type(exc).__name__
        if received:
            return StreamCutError(f"stream from {endpoint} cut mid-way ({what})", endpoint=endpoint)
        return ConnectError(f"cannot reach {endpoint} ({what})", endpoint=endpoint)
    return PermanentError(
        f"unexpected {type(exc).__name__} from {endpoint}: {str(exc)[:300]}", endpoint=endpoint
    )


def stream_error(body: object, *, endpoint: str | None) -> RequestError:
    """The error for an ``error`` object sent inside a stream (it has no HTTP status)."""
    code = _int_code(body)
    message = body_message(body, "error in stream")
    if code is not None and 400 <= code < 600:
        return status_error(code, message, endpoint=endpoint, body=body)
    return ServerError(f"error in stream from {endpoint}: {message}", endpoint=endpoint)


def _int_code(body: object) -> int | None:
    if not isinstance(body, Mapping):
        return None
    for key in ("code", "status", "status_code"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.isdigit():
            return int(value)
    return None
