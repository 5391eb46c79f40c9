"""OpenAI-compatible calls: the chat client, the error mapping, the retry policy, start checks.

Owns no files on disk.
"""

from regen.client.chat import ChatClient, ClientSettings
from regen.client.endpoints import EndpointInfo, check_endpoint, check_endpoints, server_root
from regen.client.errors import map_error, parse_retry_after, status_error
from regen.client.resolved import KeySource, ResolvedEndpoint, auth_headers, resolve_api_key
from regen.client.retry import FailureHook, RetryPolicy, RetrySettings

__all__ = [
    "ChatClient",
    "ClientSettings",
    "EndpointInfo",
    "FailureHook",
    "KeySource",
    "ResolvedEndpoint",
    "RetryPolicy",
    "RetrySettings",
    "auth_headers",
    "check_endpoint",
    "check_endpoints",
    "map_error",
    "parse_retry_after",
    "resolve_api_key",
    "server_root",
    "status_error",
]
