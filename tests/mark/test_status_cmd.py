"""`mark status`'s traffic table: requests (HTTP calls) and rows (their instances) apart."""

from __future__ import annotations

import re

from rich.console import Console

from mark.cli.status_cmd import latency_table
from mark.config import load_settings
from mark.state import LatencyRollup


def _render(rollups: dict[str, list[LatencyRollup]]) -> str:
    settings = load_settings()
    console = Console(width=200, record=True)
    console.print(latency_table(settings, rollups, 10))
    return console.export_text()


def _cells(text: str, model: str) -> list[str]:
    row = next(line for line in text.splitlines() if f" {model} " in line)
    return [c.strip() for c in re.split("[│┃]", row.strip())[1:-1]]


def test_status_shows_requests_and_rows_apart() -> None:
    """About 10 calls carrying 2,055 rows show as 10 requests and 2,055 rows, not 2,055
    requests; a minute from before requests were counted makes the count a lower bound."""
    model = load_settings().models[0].name
    minutes = [
        LatencyRollup(model, 0.0, 1000, 10, 20, 30, 1000, 0, http_requests=4),
        LatencyRollup(model, 60.0, 1055, 10, 20, 30, 1055, 0, http_requests=6),
    ]
    text = _render({model: minutes})
    header = _cells(text, "model")
    cells = dict(zip(header, _cells(text, model), strict=True))
    assert (cells["requests"], cells["rows"]) == ("10", "2055")
    old = LatencyRollup(model, 120.0, 5, 10, 20, 30, 5, 0)  # recorded before 0005
    cells = dict(zip(header, _cells(_render({model: [*minutes, old]}), model), strict=True))
    assert (cells["requests"], cells["rows"]) == ("≥10", "2060")
    cells = dict(zip(header, _cells(_render({model: []}), model), strict=True))
    assert (cells["requests"], cells["rows"]) == ("0", "0")
