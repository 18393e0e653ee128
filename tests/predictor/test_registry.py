"""Models by name and by a user's import path; saved files that are not models."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from predictor.base import ForecasterError, History
from predictor.baselines import LastValue
from predictor.registry import create, load, resolve

USER_MODULE = """
import numpy as np
from predictor.base import Forecaster


class Doubler(Forecaster):
    name = "doubler"

    def __init__(self, factor: float = 2.0) -> None:
        super().__init__()
        self.factor = factor
        self.seen = 0.0

    def params(self):
        return {"factor": self.factor}

    def _fit(self, history):
        self.seen = float(history.observed.mean())

    def _forecast(self, history, steps):
        return np.full(steps, self.factor * self.seen)

    def get_state(self):
        return {"seen": np.asarray(self.seen)}

    def set_state(self, state):
        self.seen = float(state["seen"])


class NotAModel:
    pass
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "my_models.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_models"
    sys.modules.pop("my_models", None)


def test_builtin_name_resolves() -> None:
    assert resolve("last") is LastValue
    assert resolve("predictor.baselines:LastValue") is LastValue


def test_user_model_by_import_path_fits_saves_and_loads(
    user_module: str, series: History, tmp_path: Path
) -> None:
    model = create(f"{user_module}:Doubler", factor=3.0).fit(series)
    expected = 3.0 * float(np.nanmean(series.values))
    np.testing.assert_allclose(model.forecast(series, 4), np.full(4, expected))
    again = load(model.save(tmp_path / "user"))
    assert type(again).__name__ == "Doubler"
    np.testing.assert_allclose(again.forecast(series, 4), np.full(4, expected))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nosuchmodel", "unknown model"),
        ("no_such_module_xyz:Model", "cannot import"),
        ("predictor.baselines:Nope", "no attribute"),
        ("predictor.base:History", "not a predictor.base.Forecaster"),
    ],
)
def test_bad_specs_are_forecaster_errors(spec: str, message: str) -> None:
    with pytest.raises(ForecasterError, match=message):
        resolve(spec)


def test_bad_parameters_are_forecaster_errors() -> None:
    with pytest.raises(ForecasterError, match="bad parameters"):
        create("last", horizon=3)


def test_loading_a_file_that_is_not_a_model(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.npz"
    bogus.write_bytes(b"not a zip")
    with pytest.raises(ForecasterError, match="not a saved forecaster"):
        load(bogus)
    with pytest.raises(ForecasterError, match="not a saved forecaster"):
        load(tmp_path / "missing.npz")


def test_save_adds_the_npz_suffix(series: History, tmp_path: Path) -> None:
    path = create("paper").fit(series).save(tmp_path / "model.bin")
    assert path.name == "model.bin.npz"
    assert path.is_file()
