"""The calendar of recurring rises: found, foreseen where they recur, nothing elsewhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from predictor.base import MINUTES_PER_DAY, History
from predictor.registry import create, load
from predictor.rise_calendar import RiseCalendarForecaster, rise_starts

START = np.datetime64("2026-01-05T00:00", "m")  # midnight: day k is positions k*1440...
RISE_AT = 92  # 01:32
SHAPE = [5.0, 4.0, 3.0, 2.0, 1.5]


def _days(n: int, rise_on: set[int], base: float = 10.0) -> np.ndarray:
    """``n`` days at ``base`` r/s, with a rise at 01:32 on the days in ``rise_on``."""
    x = np.full(n * MINUTES_PER_DAY, base)
    for d in rise_on:
        at = d * MINUTES_PER_DAY + RISE_AT
        x[at : at + len(SHAPE)] = base * np.asarray(SHAPE)
    return x


def _fitted(days: int, rise_on: set[int]) -> RiseCalendarForecaster:
    model = RiseCalendarForecaster(inner="last", length=5)
    model.fit(History(_days(days, rise_on), START))
    return model


def _before_the_rise(day: int, minutes_before: int, base: float = 10.0) -> History:
    """An hour of ``base`` load on ``day``, ending ``minutes_before`` 01:32."""
    end = day * MINUTES_PER_DAY + RISE_AT - minutes_before
    return History(np.full(60, base), START + np.timedelta64(end - 60, "m"))


def test_a_rise_is_a_jump_over_the_median_before_it_not_a_ramp() -> None:
    x = np.concatenate((np.full(30, 10.0), np.full(5, 40.0), np.full(30, 10.0)))
    assert np.flatnonzero(rise_starts(x, 2.0, 15, 10)).tolist() == [30]
    ramp = np.linspace(10.0, 40.0, 120)  # quadruples, but never doubles within 15 minutes
    assert not rise_starts(ramp, 2.0, 15, 10).any()


def test_a_rise_on_most_days_is_bought_before_it_comes() -> None:
    model = _fitted(6, {0, 1, 3, 4})  # four of six days
    got = model.forecast(_before_the_rise(6, 3), 12)
    # steps 0..2 are 01:29..01:31; the rise starts at step 3 with its median shape
    assert got[:3].tolist() == [10.0] * 3
    assert got[3:8] == pytest.approx([50.0, 40.0, 30.0, 20.0, 15.0])
    assert got[8:].tolist() == [10.0] * 4


def test_a_rise_on_fewer_than_half_the_days_is_not_forecast() -> None:
    model = _fitted(6, {0, 3})  # two of six
    assert model.forecast(_before_the_rise(6, 3), 12).tolist() == [10.0] * 12


def test_with_fewer_than_min_days_of_history_the_calendar_is_empty() -> None:
    model = _fitted(2, {0, 1})
    assert model.calendar.days == 2 and not model.calendar.share.any()
    assert model.forecast(_before_the_rise(2, 3), 12).tolist() == [10.0] * 12


def test_a_rise_under_way_is_left_to_the_inner_model() -> None:
    model = _fitted(6, {0, 1, 3, 4})
    x = np.full(60, 10.0)
    x[-1] = 50.0  # the rise came early, at 01:29
    history = History(x, START + np.timedelta64(6 * MINUTES_PER_DAY + RISE_AT - 60 - 2, "m"))
    assert model.forecast(history, 12).tolist() == [50.0] * 12  # "last" repeats it


def test_a_saved_model_forecasts_as_it_did(tmp_path: Path) -> None:
    model = _fitted(6, {0, 1, 3, 4})
    again = load(model.save(tmp_path / "m.npz"))
    history = _before_the_rise(6, 3)
    assert again.forecast(history, 12).tolist() == model.forecast(history, 12).tolist()
    assert isinstance(again, RiseCalendarForecaster) and again.params() == model.params()


def test_it_is_a_built_in_model_around_the_lstm() -> None:
    model = create("lstm-calendar")
    assert isinstance(model, RiseCalendarForecaster) and model.params()["inner"] == "lstm"
