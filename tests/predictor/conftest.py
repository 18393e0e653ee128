"""Tiny series and tiny model settings so every contract test runs in seconds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from predictor.base import History

START = np.datetime64("2026-03-02T00:00", "m")

# Per-model constructor arguments that keep fitting to well under a second or two.
TINY: dict[str, dict[str, Any]] = {
    "last": {},
    "seasonal": {"period": 60},
    "seasonal-week": {"period": 120},
    "paper": {},
    "ets": {"period": 60, "fit_seasons": 3, "filter_minutes": 120},
    "sarima": {"p": 1, "q": 0, "fit_days": 1, "filter_minutes": 120},
    "lstm": {"horizon": 12, "lookback": 16, "hidden": 4, "level_minutes": 4, "epochs": 2},
    "lstm-calendar": {"inner": "seasonal", "min_days": 1},  # its calendar: test_rise_calendar
}


def synthetic(minutes: int = 900, seed: int = 0) -> History:
    """An hourly wave with noise, one gap of missing minutes, and a low trough near zero."""
    rng = np.random.default_rng(seed)
    t = np.arange(minutes)
    values = 40 + 30 * np.sin(2 * np.pi * t / 60) + rng.normal(0, 3, minutes)
    values = np.maximum(values, 0.5)
    values[200:230] = np.nan
    return History(values, START)


@pytest.fixture
def series() -> History:
    return synthetic()


@pytest.fixture
def tiny() -> dict[str, dict[str, Any]]:
    return {name: dict(params) for name, params in TINY.items()}
