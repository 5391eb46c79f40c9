"""A simulated SGLang server for tests, dry runs and benchmarks (``regen simulate``).

Pure parts import cheaply: :func:`answer` (the deterministic answer to a request body),
:func:`request_key` / :func:`conversation_key` (what the server counts requests by) and
:func:`count_tokens` (the simulated token). The server lives in :mod:`regen.devkit.simulate.server`,
the test helpers in :mod:`regen.devkit.simulate.testing`. Owns no files.
"""

from regen.devkit.simulate.answer import AnswerConfig, SimAnswer, SimToolCall, answer
from regen.devkit.simulate.config import SimConfig
from regen.devkit.simulate.faults import Fault, FaultConfig
from regen.devkit.simulate.keys import conversation_key, request_key
from regen.devkit.simulate.tokens import count_tokens

__all__ = [
    "AnswerConfig",
    "Fault",
    "FaultConfig",
    "SimAnswer",
    "SimConfig",
    "SimToolCall",
    "answer",
    "conversation_key",
    "count_tokens",
    "request_key",
]
