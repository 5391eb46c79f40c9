"""Stopping a session fixture before the session ends: tests/conftest.py stops its Ray head, and
the servers a SHARED group holds (tests/engines/conftest.py's vLLM servers, the demo target's
``transformers serve``), once the next test does not need them; a later test that asks for one
starts it again."""

from __future__ import annotations

import pytest


def finish_fixture(item: pytest.Item, name: str) -> None:
    """Finish the session fixture ``name`` as seen from ``item`` where it is set up: pytest
    runs its finalizers, and those of the fixtures that use it, as at the session's end."""
    for fixturedef in item.session._fixturemanager.getfixturedefs(name, item) or ():
        if fixturedef.cached_result is not None:
            fixturedef.finish(item._request)  # type: ignore[attr-defined]
