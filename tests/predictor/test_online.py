"""Forecasts keep flowing while a refit runs; refits follow the schedule."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from predictor.base import FloatArray, Forecaster, History
from predictor.baselines import LastValue
from predictor.online import OnlinePredictor, RefitPolicy

DAY = 1440


class Gated(Forecaster):
    """Fits only when the test opens the gate, so the test sees the refit in flight."""

    name = "gated"

    def __init__(self, gate: threading.Event, value: float, fail: bool = False) -> None:
        super().__init__()
        self.gate, self.value, self.fail = gate, value, fail

    def _fit(self, history: History) -> None:
        assert self.gate.wait(5)
        if self.fail:
            raise RuntimeError("boom")

    def _forecast(self, history: History, steps: int) -> FloatArray:
        return np.full(steps, self.value)


@pytest.mark.parametrize(
    ("last_fit", "now", "n", "due"),
    [
        (None, 100, 2 * DAY, True),  # first model: do not wait for the quiet hour
        (None, 100, DAY - 1, False),  # not enough history yet
        (0, DAY + 60, 2 * DAY, False),  # a day later but before 03:00
        (0, DAY + 180, 2 * DAY, True),  # a day later, at 03:00
        (DAY + 180, DAY + 600, 2 * DAY, False),  # already refitted today
    ],
)
def test_refit_schedule(last_fit: int | None, now: int, n: int, due: bool) -> None:
    assert RefitPolicy().due(last_fit, now, n) is due


async def test_forecasts_flow_during_a_refit_then_the_new_model_serves(series: History) -> None:
    gate = threading.Event()
    online = OnlinePredictor(lambda: Gated(gate, 7.0), RefitPolicy(min_history=10))
    cold = online.forecast(series, 5)
    assert np.all(cold == pytest.approx(1.2 * np.nanmax(series.values[-60:])))  # last hour
    with ThreadPoolExecutor(1) as pool:
        task = online.maybe_refit(series, now=0, executor=pool)
        assert task is not None and online.refitting
        assert online.maybe_refit(series, now=1, executor=pool) is None  # one at a time
        np.testing.assert_array_equal(online.forecast(series, 5), cold)  # not blocked
        gate.set()
        await asyncio.wait_for(task, 5)
    np.testing.assert_array_equal(online.forecast(series, 5), np.full(5, 7.0))
    assert online.last_fit == 0 and online.last_error is None


async def test_a_failed_refit_keeps_the_old_model(series: History) -> None:
    gate = threading.Event()
    gate.set()
    online = OnlinePredictor(lambda: Gated(gate, 1.0, fail=True), RefitPolicy(min_history=10))
    online.model = LastValue().fit(series)
    task = online.maybe_refit(series, now=5)
    assert task is not None
    await task
    assert isinstance(online.model, LastValue)
    assert online.last_error == "RuntimeError: boom"
    assert online.maybe_refit(series, now=6) is None  # waits for the next schedule


def test_the_cold_start_comes_down_an_hour_after_a_peak() -> None:
    """Before any model is fitted: 1.2 x the last hour's peak, not the peak ever seen."""
    start = np.datetime64("2026-01-01T00:00", "m")
    online = OnlinePredictor(lambda: Gated(threading.Event(), 1.0))
    peak = np.r_[np.full(30, 5.0), np.full(10, 50.0), np.full(20, 5.0)]
    assert online.forecast(History(peak, start), 3) == pytest.approx([60.0] * 3)
    later = np.r_[peak, np.full(45, 5.0)]  # the peak is now over an hour old
    assert online.forecast(History(later, start), 3) == pytest.approx([6.0] * 3)


async def test_a_history_padded_with_unseen_minutes_is_not_a_day_to_fit_on() -> None:
    """1,500 minutes of grid, 3 of them observed: no refit (the runaway's cause)."""
    values = np.full(1500, np.nan)
    values[-3:] = 25.0
    online = OnlinePredictor(LastValue, RefitPolicy(min_history=DAY, at_minute_of_day=None))
    assert online.maybe_refit(History(values, np.datetime64(0, "m")), 1500) is None
    assert online.model is None
    # the cold-start rule serves meanwhile: 1.2 x the last hour's peak
    assert online.forecast(History(values, np.datetime64(0, "m")), 2).tolist() == [30.0, 30.0]
    values[:] = 25.0  # a whole observed day: the first fit starts
    task = online.maybe_refit(History(values, np.datetime64(0, "m")), 1500)
    assert task is not None
    await task
    assert online.model is not None
