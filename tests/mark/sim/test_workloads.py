"""Workloads: the surge's shape, scaling, seeded arrivals, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from mark.errors import ConfigError
from mark.sim.workloads import (
    Workload,
    _scaled,
    surge_workload,
    trace_workload,
)


def test_surge_rises_within_the_ramp_holds_and_falls_back() -> None:
    w = surge_workload(base_rps=100, surge=0.75, hours=1, surge_at_s=600, ramp_s=120, hold_s=300)
    x = w.per_second[w.start :]
    assert x[599] == 100 and x[660] == pytest.approx(137.5) and x[720] == pytest.approx(175)
    assert x[1000] == pytest.approx(175) and x[1200] == 100


def test_arrivals_are_seeded_sorted_and_poisson_around_the_load() -> None:
    w = Workload("flat", np.full(2000, 50.0), 1000.0, 0, 2000)
    a = w.arrivals(0, 2000, seed=7)
    assert np.array_equal(a, w.arrivals(0, 2000, seed=7))
    assert np.all(np.diff(a) >= 0) and a[0] >= 1000.0 and a[-1] < 3000.0
    assert abs(a.shape[0] - 100_000) < 4 * np.sqrt(100_000)


def test_time_scale_averages_and_rate_scale_multiplies() -> None:
    x = np.array([1.0, 3.0, 5.0, 7.0])
    assert _scaled(x, 2.0, 2.0).tolist() == pytest.approx([4.0, 12.0])
    assert _scaled(x, 1.0, 0.5).tolist() == pytest.approx([1, 1, 3, 3, 5, 5, 7, 7])


def test_a_window_past_the_trace_end_is_refused() -> None:
    with pytest.raises(ConfigError, match="cannot simulate"):
        trace_workload("twitter", hours=24, start_day=14)
    with pytest.raises(ConfigError, match="no trace"):
        trace_workload("/nonexistent.csv", hours=1, start_day=0)


def test_twitter_gaps_are_filled_not_zero() -> None:
    w = trace_workload("twitter", hours=1, start_day=0)
    gap = w.per_second[84_700:86_300]  # day 0's archive gap 23:31-23:59
    assert gap.min() > 10  # interpolated between the neighbours (~45 r/s), not 0
