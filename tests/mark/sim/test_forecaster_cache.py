"""The simulator's forecaster cache: a model is reused only if it is the same model."""

from __future__ import annotations

from pathlib import Path

import pytest

import predictor.registry
from mark.sim.compare import train_forecaster
from mark.sim.workloads import mmpp_workload
from predictor.base import Forecaster
from predictor.baselines import SeasonalNaive


def test_a_model_with_other_parameters_is_trained_again_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workload = mmpp_workload(hours=1, history_days=1)
    period = {"now": 1440}

    def create(spec: str) -> Forecaster:  # what a code change to the model's defaults does
        return SeasonalNaive(period=period["now"])

    monkeypatch.setattr(predictor.registry, "create", create)
    first = train_forecaster("seasonal", workload, 900, tmp_path)
    assert len(list(tmp_path.iterdir())) == 1
    again = train_forecaster("seasonal", workload, 900, tmp_path)
    assert len(list(tmp_path.iterdir())) == 1  # the same model: loaded from the cache
    assert again.params() == first.params() == {"period": 1440}
    period["now"] = 60
    changed = train_forecaster("seasonal", workload, 900, tmp_path)
    assert changed.params() == {"period": 60}  # not yesterday's model from the cache
    assert len(list(tmp_path.iterdir())) == 2
