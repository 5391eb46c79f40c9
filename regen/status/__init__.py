"""The numbers of a run from its run directory: shared by `regen status` and the dashboard.

- :mod:`.view`: :class:`RunView`, the run directory read tick after tick (the one module here
  that touches files: three small files per tick, the manifest and the plan once, ``parts/``
  listed every ``RECONCILE_EVERY_S``);
- :mod:`.files`: what one refresh read (:class:`RunFiles`), and what vanished from the parts
  (:class:`PartsCheck`, :func:`deficit`);
- :mod:`.state`: the run's state (``running``, ``stalled``, ``dead``, ``unknown``, ...) from the
  progress file, the lock holder and the reader's clock;
- :mod:`.rates`: the token rates over the last 1, 5 and 15 minutes, and the ETA with its band;
- :mod:`.numbers`: :func:`compute`, all of them together;
- :mod:`.records`: :class:`RunNumbers` and the records it holds (`regen status --json`).

Definitions are pure functions of those files and ``now``; each module's docstring gives its
own.
"""

from regen.status.files import PartsCheck, RunFiles, deficit
from regen.status.numbers import compute, endpoints, settings_differ, shown, sources
from regen.status.rates import (
    DEFAULT_OUTPUT_TOKENS,
    MAX_LENGTH_REL,
    MIN_RATE_SPAN_S,
    RATE_WINDOWS_S,
    estimate_eta,
    last_growth_at,
    length_cv,
    window_rate,
)
from regen.status.records import (
    ALWAYS,
    DERIVED,
    EndpointNumbers,
    ErrorNumbers,
    Eta,
    Holder,
    Rate,
    RunNumbers,
    SourceNumbers,
    by_count,
)
from regen.status.state import CLOCK_SKEW_S, STALL_AFTER_S, read_holder, run_state, stall_limit
from regen.status.view import RECONCILE_EVERY_S, RunView

__all__ = [
    "ALWAYS",
    "CLOCK_SKEW_S",
    "DEFAULT_OUTPUT_TOKENS",
    "DERIVED",
    "MAX_LENGTH_REL",
    "MIN_RATE_SPAN_S",
    "RATE_WINDOWS_S",
    "RECONCILE_EVERY_S",
    "STALL_AFTER_S",
    "EndpointNumbers",
    "ErrorNumbers",
    "Eta",
    "Holder",
    "PartsCheck",
    "Rate",
    "RunFiles",
    "RunNumbers",
    "RunView",
    "SourceNumbers",
    "by_count",
    "compute",
    "deficit",
    "endpoints",
    "estimate_eta",
    "last_growth_at",
    "length_cv",
    "read_holder",
    "run_state",
    "settings_differ",
    "shown",
    "sources",
    "stall_limit",
    "window_rate",
]
