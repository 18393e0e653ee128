"""The simulation's forecaster is fitted in a child process with pinned numerics: the
child sees them, the parent's own settings stay, a failed fit says why, and an LSTM comes
out the same whatever vector width the CPU offers."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mark.sim.pinned_fit import fit_pinned, pinned_env
from predictor.base import ForecasterError, History

START = np.datetime64("2026-03-02T00:00", "m")

USER_MODULE = """
import os

import numpy as np

from predictor.base import Forecaster, ForecasterError
from predictor.lstm import LSTMForecaster


class EnvProbe(Forecaster):
    '''Forecasts 1 where it was fitted with MKL pinned to its compatible path, else 0.'''

    name = "env-probe"

    def __init__(self) -> None:
        super().__init__()
        self.pinned = 0.0

    def params(self):
        return {}

    def _fit(self, history):
        self.pinned = float(os.environ.get("MKL_CBWR") == "COMPATIBLE")

    def _forecast(self, history, steps):
        return np.full(steps, self.pinned)

    def get_state(self):
        return {"pinned": np.asarray(self.pinned)}

    def set_state(self, state):
        self.pinned = float(state["pinned"])


class Refuses(EnvProbe):
    def _fit(self, history):
        raise ForecasterError("too short to learn from")


class TinyLSTM(LSTMForecaster):
    def __init__(self, **kw):
        super().__init__(**{"horizon": 12, "lookback": 16, "hidden": 4, "level_minutes": 4,
                            "epochs": 2, **kw})
"""


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A user's module of forecasters, importable here and in the child."""
    (tmp_path / "pin_models.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    yield "pin_models"
    sys.modules.pop("pin_models", None)


def _history(minutes: int = 900) -> History:
    rng = np.random.default_rng(0)
    t = np.arange(minutes)
    return History(40 + 30 * np.sin(2 * np.pi * t / 60) + rng.normal(0, 3, minutes), START)


def test_the_child_fits_with_the_pinned_numerics_and_the_parent_keeps_its_own(
    models: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MKL_CBWR", raising=False)
    model = fit_pinned(f"{models}:EnvProbe", _history(), tmp_path / "out" / "probe.npz")
    assert model.forecast(_history(), 3).tolist() == [1.0, 1.0, 1.0]
    assert (tmp_path / "out" / "probe.npz").stat().st_size > 0
    assert "MKL_CBWR" not in os.environ  # the simulator's own numerics are not touched
    env = pinned_env()
    assert env["MKL_CBWR"] == "COMPATIBLE"
    umath = importlib.import_module("numpy._core._multiarray_umath")
    off = set(env["NPY_DISABLE_CPU_FEATURES"].split())
    assert off == set(umath.__cpu_dispatch__) and not off & set(umath.__cpu_baseline__)


def test_a_fit_that_fails_in_the_child_says_why(models: str, tmp_path: Path) -> None:
    with pytest.raises(ForecasterError, match="too short to learn from"):
        fit_pinned(f"{models}:Refuses", _history(), tmp_path / "refused.npz")
    assert not (tmp_path / "refused.npz").exists()


def test_an_lstm_fits_to_the_same_weights_whatever_vector_width_the_cpu_offers(
    models: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU with AVX-512 the second fit emulates one with AVX2 alone (ATen's kernels,
    MKL's instructions): without the pinned numerics the weights differ there in the
    last bits (mark.sim.pinned_fit); with them they are the same to the bit."""
    native = fit_pinned(f"{models}:TinyLSTM", _history(), tmp_path / "native.npz")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    narrow = fit_pinned(f"{models}:TinyLSTM", _history(), tmp_path / "avx2.npz")
    a, b = native.get_state(), narrow.get_state()
    assert a.keys() == b.keys() and len(a) > 2
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    np.testing.assert_array_equal(native.forecast(_history(), 12), narrow.forecast(_history(), 12))
