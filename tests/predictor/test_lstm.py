"""LSTM specifics: the asymmetric loss and what its weight does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from predictor.base import ForecasterError, History
from predictor.evaluate import rolling_origin, score
from predictor.lstm import MIN_LEVEL_STD, LSTMForecaster

START = np.datetime64("2026-03-02T00:00", "m")


def test_under_prediction_costs_under_weight_times_more() -> None:
    model = LSTMForecaster(horizon=2, lookback=4, level_minutes=2, hidden=2, under_weight=3.0)
    target = torch.tensor([[1.0, 1.0]])
    mask = torch.ones(1, 2)
    under = model._loss(torch.tensor([[0.5, 0.5]]), target, mask)
    over = model._loss(torch.tensor([[1.5, 1.5]]), target, mask)
    assert float(under) == pytest.approx(3 * float(over))
    # Masked (gap) targets cost nothing however wrong the forecast is.
    assert float(model._loss(torch.tensor([[9.0, 1.0]]), target, torch.tensor([[0.0, 1.0]]))) == 0


def test_a_higher_under_weight_under_predicts_less(tiny: dict[str, dict[str, Any]]) -> None:
    """w/(1+w) is the quantile learned: w = 9 aims at the 90th percentile, w = 1 at the median."""
    rng = np.random.default_rng(0)
    noisy = History(50 * rng.lognormal(0, 0.3, 1400), np.datetime64("2026-03-02T00:00"))
    params = {**tiny["lstm"], "epochs": 10, "batch_size": 32}
    rates = {}
    for w in (1.0, 9.0):
        run = rolling_origin(LSTMForecaster(**params, under_weight=w), noisy, 900, 12, 7)
        rates[w] = score("lstm", run).under_rate
    assert rates[1.0] > 30
    assert rates[9.0] < rates[1.0] - 20


def test_forecast_beyond_the_horizon_holds_the_last_step(
    tiny: dict[str, dict[str, Any]], series: History
) -> None:
    model = LSTMForecaster(**tiny["lstm"]).fit(series)
    out = model.forecast(series, 20)
    assert np.all(out[12:] == out[11])
    np.testing.assert_array_equal(out[:12], model.forecast(series, 12))


def test_fit_restores_the_callers_thread_count(
    tiny: dict[str, dict[str, Any]], series: History
) -> None:
    before = torch.get_num_threads()
    LSTMForecaster(**tiny["lstm"], threads=1).fit(series).forecast(series, 3)
    assert torch.get_num_threads() == before


def test_a_surge_after_days_of_steady_load_is_not_read_as_tens_of_deviations(
    tiny: dict[str, dict[str, Any]],
) -> None:
    """Steady load's level barely moves, so scaled by its own spread a +50 % surge was
    tens of units off anything trained on, and the forecast jumped a hundredfold (``--trace
    surge``: 23,000 r/s from 160). The spread is floored at ``MIN_LEVEL_STD``."""
    rng = np.random.default_rng(3)
    steady = 100 * rng.lognormal(0, 0.02, 1400)
    model = LSTMForecaster(**{**tiny["lstm"], "epochs": 10}).fit(History(steady, START))
    assert model.level_std == MIN_LEVEL_STD
    surged = np.concatenate((steady, 150 * rng.lognormal(0, 0.02, 30)))
    out = model.forecast(History(surged, START), 12)
    assert np.all(np.isfinite(out)) and out.max() < 3 * 150


def test_a_model_saved_with_a_spread_below_the_floor_is_refused(
    tiny: dict[str, dict[str, Any]],
) -> None:
    """Such a model (saved before the floor: its file names no ``min_level_std``, so it
    loads with the floor) reads any change of level as tens of deviations: refit it."""
    rng = np.random.default_rng(3)
    steady = History(100 * rng.lognormal(0, 0.02, 1400), START)
    old = LSTMForecaster(**{**tiny["lstm"], "epochs": 2, "min_level_std": 1e-3}).fit(steady)
    assert old.level_std < MIN_LEVEL_STD
    with pytest.raises(ForecasterError, match="refit"):
        LSTMForecaster(**tiny["lstm"]).set_state(old.get_state())
    LSTMForecaster(**{**tiny["lstm"], "min_level_std": 1e-3}).set_state(old.get_state())
