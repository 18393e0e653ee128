"""The simulator's forecaster cache: a model is reused only if it is the same model."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from mark.sim.compare import train_forecaster
from mark.sim.workloads import mmpp_workload

# A model whose default changes with the environment, as a code change to its defaults
# would: the parent (which keys the cache) and the child (which fits) both read it.
USER_MODULE = """
import os

from predictor.baselines import SeasonalNaive


class Seasonal(SeasonalNaive):
    def __init__(self, period=None):
        super().__init__(period=int(os.environ["CACHE_TEST_PERIOD"]) if period is None else period)
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``USER_MODULE`` as ``cache_models.py``, importable here and in the fitting child."""
    code = tmp_path / "code"
    code.mkdir()
    module = code / "cache_models.py"
    module.write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(code))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(code), *sys.path]))
    monkeypatch.setenv("CACHE_TEST_PERIOD", "1440")
    yield module
    sys.modules.pop("cache_models", None)


SPEC = "cache_models:Seasonal"


@pytest.mark.usefixtures("user_module")
def test_a_model_with_other_parameters_is_trained_again_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    workload = mmpp_workload(hours=1, history_days=1)
    first = train_forecaster(SPEC, workload, 900, cache)
    assert len(list(cache.iterdir())) == 1
    again = train_forecaster(SPEC, workload, 900, cache)
    assert len(list(cache.iterdir())) == 1  # the same model: loaded from the cache
    assert again.params() == first.params() == {"period": 1440}
    monkeypatch.setenv("CACHE_TEST_PERIOD", "60")
    changed = train_forecaster(SPEC, workload, 900, cache)
    assert changed.params() == {"period": 60}  # not yesterday's model from the cache
    assert len(list(cache.iterdir())) == 2


def test_without_a_cache_the_model_is_fitted_and_nothing_is_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    model = train_forecaster("seasonal", mmpp_workload(hours=1, history_days=1), 900, None)
    assert model.fitted
    assert list(tmp_path.iterdir()) == []


def test_a_model_whose_code_changed_is_trained_again_not_loaded(
    tmp_path: Path, user_module: Path
) -> None:
    """The same name and parameters, other code (here one more line): fitted again."""
    cache = tmp_path / "cache"
    workload = mmpp_workload(hours=1, history_days=1)
    train_forecaster(SPEC, workload, 900, cache)
    train_forecaster(SPEC, workload, 900, cache)
    assert len(list(cache.iterdir())) == 1  # unchanged: loaded
    user_module.write_text(textwrap.dedent(USER_MODULE) + "\nSMOOTHING = 0.5\n")
    changed = train_forecaster(SPEC, workload, 900, cache)
    assert changed.params() == {"period": 1440}  # the parameters did not change ...
    assert len(list(cache.iterdir())) == 2  # ... the code did: fitted again
