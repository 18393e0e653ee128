"""Metrics on hand-computed cases, and the rolling origin never scores a gap."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from predictor.base import ForecasterError, History
from predictor.baselines import LastValue
from predictor.evaluate import Evaluation, Run, evaluate, rolling_origin, score


def run(forecasts: list[list[float]], truth: list[list[float]]) -> Run:
    return Run(np.arange(len(truth)), np.array(forecasts), np.array(truth), 0.0, 0.0)


def test_metrics_by_hand() -> None:
    s = score("m", run([[110.0, 90.0, 50.0, 1.0]], [[100.0, 100.0, 50.0, np.nan]]))
    # relative errors +10%, -10%, 0%; the NaN step is not scored
    assert s.steps == 3
    assert s.mape == pytest.approx(20 / 3)
    assert s.rmse == pytest.approx(np.sqrt(200 / 3))
    assert s.under_rate == pytest.approx(100 / 3)
    assert s.over_provision == pytest.approx(10 / 3)
    assert s.shortfall == pytest.approx(10 / 3)


def test_rolling_origin_last_value_on_a_step() -> None:
    values = np.concatenate((np.full(100, 10.0), np.full(100, 20.0)))
    values[150:155] = np.nan
    r = rolling_origin(LastValue(), History(values, np.datetime64("2026-01-01T00:00")), 80, 10, 5)
    assert r.forecasts.shape == r.truth.shape == (r.origins.size, 10)
    assert r.origins[0] == 79
    assert r.origins[-1] <= 200 - 10 - 1
    # Forecast from origin o is values[o] (the last observed before it).
    for o, f in zip(r.origins, r.forecasts, strict=True):
        assert np.all(f == values[: o + 1][np.isfinite(values[: o + 1])][-1])
    s = score("last", r)
    assert s.steps == int(np.isfinite(r.truth).sum()) < r.truth.size


def test_evaluate_is_plain_data_and_names_the_best_naive() -> None:
    t = np.arange(600)
    h = History(50 + 20 * np.sin(2 * np.pi * t / 60), np.datetime64("2026-01-01T00:00"))
    ev = evaluate(h, ["last", "seasonal", "paper"], 300, 30, 15, {"seasonal": {"period": 60}})
    data = json.loads(json.dumps(ev.as_dict()))
    assert [s["model"] for s in data["scores"]] == ["last", "seasonal", "paper"]
    # A clean 60-minute wave is exactly what a 60-minute seasonal naive predicts.
    assert data["best_naive"] == "seasonal"
    assert data["scores"][1]["mape"] == pytest.approx(0.0, abs=1e-9)


def test_mape_gain_is_relative_to_the_best_naive() -> None:
    ev = Evaluation("t", 1, 1, 1, 1)
    for name, mape in (("last", 30.0), ("seasonal", 20.0), ("paper", 400.0), ("lstm", 15.0)):
        ev.scores.append(replace(score(name, run([[1.0]], [[1.0]])), mape=mape))
    best = ev.best_naive()
    assert best is not None and best.model == "seasonal"
    assert ev.mape_gain("lstm") == pytest.approx(25.0)
    assert ev.as_dict()["mape_gain_vs_best_naive"] == {"lstm": pytest.approx(25.0)}


def test_too_little_data_is_a_forecaster_error() -> None:
    h = History(np.ones(50), np.datetime64("2026-01-01T00:00"))
    with pytest.raises(ForecasterError, match="train minutes"):
        rolling_origin(LastValue(), h, 45, horizon=10)
