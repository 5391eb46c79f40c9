"""The one error taxonomy of regen.

Every failure regen raises on purpose is a subclass of :class:`RegenError`. Callers decide by
type (and, for HTTP, by status code carried on the exception), never by message text.

    RegenError
    ├── ConfigError                 bad manifest / train config / CLI override (names the field)
    ├── SourceError                 a source cannot be read at all (names the source)
    ├── RowError                    one input row is unusable (source, row, field, reason)
    ├── TemplateError               chat template / tokenizer problem
    ├── RunDirError                 run directory problems
    │   ├── LockHeldError           another live run holds the directory
    │   └── FingerprintMismatchError  the directory was made by a different manifest
    ├── EndpointError               no usable endpoint at start (names each and why)
    ├── RequestError                one request to an endpoint failed
    │   ├── TransientError          retried: connection, timeout, 408/429/5xx, stream cut
    │   │   ├── ConnectError
    │   │   ├── RequestTimeoutError
    │   │   ├── OverloadedError     503: the server is busy, not sick (carries retry_after)
    │   │   │   └── RateLimitedError  429 (a gateway's way of saying the same)
    │   │   ├── ServerError         (other 5xx, 408)
    │   │   └── StreamCutError      stream ended before finish_reason
    │   └── PermanentError          recorded, not retried: 400, 404, context too long
    │       └── ContextLengthError
    └── TrapError                   a training/serving configuration that silently ruins a draft
"""

from __future__ import annotations


class RegenError(Exception):
    """Base of every error regen raises on purpose."""

    #: short machine-readable class name used in counters and failure records
    kind: str = "error"


class ConfigError(RegenError):
    """A configuration value is invalid. ``field`` is the dotted path of the offending field."""

    kind = "config"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SourceError(RegenError):
    """A whole source cannot be read (unreachable hub id, missing file, no network)."""

    kind = "source"

    def __init__(self, source: str, message: str) -> None:
        super().__init__(f"source {source!r}: {message}")
        self.source = source


class RowError(RegenError):
    """One input row is unusable. ``reason`` is a short stable code used for counting."""

    kind = "row"

    def __init__(self, reason: str, detail: str = "", *, field: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.field = field


class TemplateError(RegenError):
    """The chat template or tokenizer cannot produce a training row."""

    kind = "template"


class RunDirError(RegenError):
    """The run directory cannot be used as asked."""

    kind = "rundir"


class LockHeldError(RunDirError):
    """Another live run holds the run directory's lock."""

    kind = "lock_held"


class FingerprintMismatchError(RunDirError):
    """The run directory was made by a different manifest/model/sampling/template."""

    kind = "fingerprint_mismatch"


class EndpointError(RegenError):
    """No endpoint is usable at start."""

    kind = "endpoint"


class RequestError(RegenError):
    """One request to an endpoint failed."""

    kind = "request"

    def __init__(self, message: str, *, status: int | None = None, endpoint: str | None = None):
        super().__init__(message)
        self.status = status
        self.endpoint = endpoint


class TransientError(RequestError):
    """Worth retrying: the same request may succeed later."""

    kind = "transient"


class ConnectError(TransientError):
    kind = "connect"


class RequestTimeoutError(TransientError):
    kind = "timeout"


class OverloadedError(TransientError):
    """The server is busy, not sick: HTTP 503 (SGLang answers a full queue, a request that
    waited or ran past its timeout, and a request retracted under memory pressure with 503,
    before the stream or inside it after HTTP 200). A back-off signal for the in-flight limit;
    it never takes an endpoint out of rotation by itself. ``retry_after``: the server's
    Retry-After in seconds, when it sent one (SGLang never does)."""

    kind = "overloaded"

    def __init__(self, message: str, *, retry_after: float | None = None, **kw) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class RateLimitedError(OverloadedError):
    """HTTP 429 (gateways and other servers; SGLang never sends it): an overload signal too."""

    kind = "rate_limited"


class ServerError(TransientError):
    """HTTP 5xx other than 503, or 408."""

    kind = "server_error"

    def __init__(self, message: str, *, retry_after: float | None = None, **kw) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class StreamCutError(TransientError):
    """The stream ended before a finish_reason arrived."""

    kind = "stream_cut"


class PermanentError(RequestError):
    """Not worth retrying automatically: recorded with its reason, retried only on request."""

    kind = "permanent"


class ContextLengthError(PermanentError):
    """The prompt (plus max_tokens) does not fit the server's context."""

    kind = "context_length"


class TrapError(RegenError):
    """A configuration that would silently ruin a draft model. ``trap`` names it."""

    kind = "trap"

    def __init__(self, trap: str, message: str, fix: str) -> None:
        super().__init__(f"[{trap}] {message} Fix: {fix}")
        self.trap = trap
        self.fix = fix
