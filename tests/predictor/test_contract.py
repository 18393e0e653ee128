"""Every built-in model keeps the Forecaster contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from predictor.base import Forecaster, ForecasterError, History
from predictor.registry import BUILTIN, create, load

MODELS = sorted(BUILTIN)


def fitted(name: str, tiny: dict[str, dict[str, Any]], history: History) -> Forecaster:
    return create(name, **tiny[name]).fit(history)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("steps", [1, 7, 60])
def test_forecast_shape_finite_nonnegative(
    name: str, steps: int, tiny: dict[str, dict[str, Any]], series: History
) -> None:
    model = fitted(name, tiny, series)
    for cut in (len(series), 215, 100):  # the end, inside the gap, early
        out = model.forecast(series.head(cut), steps)
        assert out.shape == (steps,)
        assert out.dtype == np.float64
        assert np.all(np.isfinite(out))
        assert np.all(out >= 0)


@pytest.mark.parametrize("name", MODELS)
def test_never_negative_on_a_collapsing_load(
    name: str, tiny: dict[str, dict[str, Any]], series: History
) -> None:
    """A load falling to zero tempts trend-following models below zero."""
    model = fitted(name, tiny, series)
    falling = np.concatenate((series.values[:600], np.linspace(40, 0, 120)))
    out = model.forecast(History(falling, series.start), 60)
    assert np.all(out >= 0)


@pytest.mark.parametrize("name", MODELS)
def test_save_load_round_trip(
    name: str, tiny: dict[str, dict[str, Any]], series: History, tmp_path: Path
) -> None:
    model = fitted(name, tiny, series)
    path = model.save(tmp_path / f"{name}.npz")
    again = load(path)
    assert type(again) is type(model)
    assert again.params() == model.params()
    np.testing.assert_array_equal(again.forecast(series, 30), model.forecast(series, 30))


@pytest.mark.parametrize("name", MODELS)
def test_deterministic_fit(name: str, tiny: dict[str, dict[str, Any]], series: History) -> None:
    a = fitted(name, tiny, series).forecast(series, 30)
    b = fitted(name, tiny, series).forecast(series, 30)
    np.testing.assert_array_equal(a, b)


def test_lstm_seed_matters(tiny: dict[str, dict[str, Any]], series: History) -> None:
    """Guards the determinism test above against a model that ignores its seed."""
    a = create("lstm", **tiny["lstm"], seed=1).fit(series).forecast(series, 12)
    b = create("lstm", **tiny["lstm"], seed=2).fit(series).forecast(series, 12)
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("name", MODELS)
def test_misuse_is_a_forecaster_error(
    name: str, tiny: dict[str, dict[str, Any]], series: History, tmp_path: Path
) -> None:
    model = create(name, **tiny[name])
    with pytest.raises(ForecasterError, match="fitted"):
        model.forecast(series, 5)
    with pytest.raises(ForecasterError, match="fitted"):
        model.save(tmp_path / "x.npz")
    model.fit(series)
    with pytest.raises(ForecasterError, match="steps"):
        model.forecast(series, 0)
    empty = History(np.full(10, np.nan), series.start)
    with pytest.raises(ForecasterError, match="no observed"):
        model.forecast(empty, 5)
    with pytest.raises(ForecasterError, match="no observed"):
        create(name, **tiny[name]).fit(empty)


@pytest.mark.parametrize("name", ["ets", "sarima"])
def test_seasonal_statistical_models_learn_a_clean_season(name: str) -> None:
    """On a noiseless repeating day, the fitted profile alone forecasts it almost exactly."""
    t = np.arange(3 * 1440)
    values = 60 + 25 * np.sin(2 * np.pi * t / 1440) + 10 * np.sin(2 * np.pi * t / 90)
    day = History(values, np.datetime64("2026-03-02T00:00"))
    extra = {"smooth": 1} if name == "ets" else {"smooth": 1, "p": 1, "q": 0, "fit_days": 1}
    model = create(name, **extra).fit(day.head(2 * 1440))
    cut = 2 * 1440 + 300
    out = model.forecast(day.head(cut), 60)
    np.testing.assert_allclose(out, values[cut : cut + 60], rtol=0.03)
