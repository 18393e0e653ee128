"""``experiments/windows/rises.py``: the rates the rise is read from."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments" / "windows"))
from rises import per_minute  # type: ignore[import-not-found]


def test_arrivals_are_counted_into_5_s_windows_per_minute_as_rates() -> None:
    since = 1000.0
    # 3 requests in the first 5 s, 1 at 62 s (minute 1, window 0), 1 past the span, 1 before
    arrivals = np.array([999.0, 1000.0, 1001.5, 1004.9, 1062.0, 1000.0 + 3600.0])
    rates = per_minute(arrivals, since, 1)
    assert rates.shape == (60, 12)
    assert rates[0, 0] == 3 / 5 and rates[1, 0] == 1 / 5
    assert rates.sum() * 5 == 4  # the one before ``since`` and the one past the hour left out
