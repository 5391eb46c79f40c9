"""What the views call an endpoint's state: `regen status`'s line, the dashboard's panel."""

from __future__ import annotations

import io

from rich.console import Console

from monitor.render import endpoints_panel, fmt_endpoints
from regen.status import EndpointNumbers


class Numbers:  # the two fields the endpoint views read of a RunNumbers
    def __init__(self, endpoints: list[EndpointNumbers]) -> None:
        self.endpoints = endpoints


def ep(port: int, healthy: bool | None, health: str | None) -> EndpointNumbers:
    return EndpointNumbers(f"http://127.0.0.1:{port}/v1", 0, healthy, None, 0, 0, health=health)


def test_each_endpoint_out_of_rotation_is_named_with_its_state() -> None:
    n = Numbers([ep(1, True, "up"), ep(2, False, "stalled"), ep(3, False, "down"),
                 ep(4, False, "refused"), ep(5, None, None)])  # fmt: skip
    assert fmt_endpoints(n) == (  # type: ignore[arg-type]
        "1/5 up (127.0.0.1:2 stalled, 127.0.0.1:3 DOWN, 127.0.0.1:4 REFUSED), 1 not reported"
    )


def test_an_older_progress_file_without_health_reads_as_before() -> None:
    assert [ep(1, True, None).label, ep(2, False, None).label, ep(3, None, None).label] == [
        "up",
        "DOWN",
        "?",
    ]
    assert ep(4, True, "half_open").label == "up"


def test_the_dashboards_panel_says_stalled() -> None:
    console = Console(width=120, file=io.StringIO(), record=True)
    console.print(endpoints_panel(Numbers([ep(1, True, "up"), ep(2, False, "stalled")])))  # type: ignore[arg-type]
    text = console.export_text()
    line = next(ln for ln in text.splitlines() if "127.0.0.1:2" in ln)
    assert "stalled" in line
