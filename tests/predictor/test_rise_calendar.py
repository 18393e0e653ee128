"""The calendar of recurring rises: found, foreseen beside the forecast where they recur
(with the share of days they came on), nothing elsewhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from predictor.base import MINUTES_PER_DAY, ForecasterError, History
from predictor.registry import create, load
from predictor.rise_calendar import (
    RiseCalendarForecaster,
    calibrated,
    pooled_adjacent,
    rise_starts,
)

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


def _rises(
    model: RiseCalendarForecaster, history: History, steps: int
) -> tuple[list[float], list[float]]:
    out = model.rises(history, steps)
    assert out is not None
    return out.chance.tolist(), out.rate.tolist()


def test_a_recurring_rise_is_foreseen_with_its_share_of_days_and_shape() -> None:
    model = _fitted(6, {0, 1, 3, 4})  # four of six days
    history = _before_the_rise(6, 3)
    chance, rate = _rises(model, history, 12)
    # steps 0..2 are 01:29..01:31; the rise starts at step 3, for its length (5)
    assert chance == pytest.approx([0.0] * 3 + [4 / 6] * 5 + [0.0] * 4)
    assert rate[3:8] == pytest.approx([50.0, 40.0, 30.0, 20.0, 15.0])
    assert rate[:3] == [0.0] * 3 and rate[8:] == [0.0] * 4
    # The forecast is the inner model's median day: the rise is the planner's to weigh.
    assert model.forecast(history, 12).tolist() == [10.0] * 12


def test_a_rise_is_foreseen_as_load_added_to_the_base_not_multiplied() -> None:
    model = _fitted(6, {0, 1, 3, 4})  # rises of +40, +30, +20, +10, +5 over a base of 10
    _, rate = _rises(model, _before_the_rise(6, 3, base=30.0), 12)
    assert rate[3:8] == pytest.approx([70.0, 60.0, 50.0, 40.0, 35.0])  # not 150, 120, ...


def test_a_rise_seen_once_is_given_the_chance_such_minutes_had_out_of_sample() -> None:
    twice = _fitted(6, {0, 3}).rises(_before_the_rise(6, 3), 12)
    assert twice is not None and twice.chance[3] == pytest.approx(2 / 6)
    once = _fitted(6, {3}).rises(_before_the_rise(6, 3), 12)
    # Left out, its day had a rise where no other day had one: one in every 6 x 1440.
    assert once is not None and once.chance[3] == pytest.approx(1 / (6 * MINUTES_PER_DAY))
    floor = RiseCalendarForecaster(inner="last", length=5, share=0.5)
    floor.fit(History(_days(6, {0, 3}), START))  # a third of the days, under its floor
    assert floor.rises(_before_the_rise(6, 3), 12) is None


def test_the_chance_is_measured_out_of_sample_and_grows_with_the_count() -> None:
    rng = np.random.default_rng(3)
    by_day = rng.random((10, MINUTES_PER_DAY)) < 0.01  # rises at random minutes
    by_day[:, 100] = True  # and every day at 01:40
    by_day[:7, 200] = True  # and on seven of ten days at 03:20
    chance = calibrated(by_day)
    counts = by_day.sum(axis=0)
    assert chance[100] == pytest.approx(1.0) and 0.5 < chance[200] < 1.0
    # a minute with a random rise or two: about the 1 % it is, not its 10 or 20 % share
    assert chance[counts == 1].max() < 0.05 and chance[counts == 2].max() < 0.1
    order = np.argsort(counts, kind="stable")
    assert np.all(np.diff(chance[order]) >= -1e-12)  # more days, no lower chance


def test_pooling_adjacent_violators_is_the_weighted_monotone_fit() -> None:
    hits = np.array([0.0, 4.0, 0.0, 3.0])
    counts = np.array([10.0, 4.0, 2.0, 3.0])
    assert pooled_adjacent(hits, counts).tolist() == pytest.approx([0.0, 4 / 6, 4 / 6, 1.0])


def test_with_fewer_than_min_days_of_history_the_calendar_is_empty() -> None:
    model = _fitted(2, {0, 1})
    assert model.calendar.days == 2 and not model.calendar.chance.any()
    assert model.rises(_before_the_rise(2, 3), 12) is None


def test_a_rise_under_way_is_left_to_the_inner_model() -> None:
    model = _fitted(6, {0, 1, 3, 4})
    x = np.full(60, 10.0)
    x[-1] = 50.0  # the rise came early, at 01:29
    history = History(x, START + np.timedelta64(6 * MINUTES_PER_DAY + RISE_AT - 60 - 2, "m"))
    assert model.rises(history, 12) is None
    assert model.forecast(history, 12).tolist() == [50.0] * 12  # "last" repeats it


def test_a_saved_model_foresees_as_it_did(tmp_path: Path) -> None:
    model = _fitted(6, {0, 1, 3, 4})
    again = load(model.save(tmp_path / "m.npz"))
    history = _before_the_rise(6, 3)
    assert isinstance(again, RiseCalendarForecaster) and again.params() == model.params()
    assert _rises(again, history, 12) == _rises(model, history, 12)
    assert again.forecast(history, 12).tolist() == model.forecast(history, 12).tolist()


def test_a_calendar_saved_with_multiplied_rises_is_refitted_not_misread(tmp_path: Path) -> None:
    model = _fitted(6, {0, 1, 3, 4})
    path = model.save(tmp_path / "m.npz")
    with np.load(path) as saved:
        old = {k: saved[k] for k in saved.files if "calendar.version" not in k}
    np.savez(path, **old)  # as the version before this one saved it
    with pytest.raises(ForecasterError, match="refit"):
        load(path)


def test_it_is_a_built_in_model_around_the_lstm() -> None:
    model = create("lstm-calendar")
    assert isinstance(model, RiseCalendarForecaster) and model.params()["inner"] == "lstm"
