"""The one interface every workload forecaster implements.

The planner needs, each minute, the predicted maximum request rate of each of
the next P_w minutes. A forecaster is fitted once on a long history and then
asked, many times, to forecast from whatever history the caller has now; it
must never return a negative or non-finite rate, so the wrapper `forecast`
enforces that for every model instead of trusting each one.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
MINUTES_PER_DAY = 1440
MINUTES_PER_WEEK = 7 * MINUTES_PER_DAY
# 1970-01-01 was a Thursday; with Monday = 0 that is day 3.
_EPOCH_WEEKDAY = 3
FORMAT_VERSION = 1


class ForecasterError(Exception):
    """A model cannot be built, fitted, loaded or asked for this forecast."""


@dataclass(frozen=True)
class History:
    """Per-minute maximum rates (req/s) on a regular one-minute grid.

    `start` is the UTC minute of `values[0]`; NaN marks a minute with no data
    (a telemetry or archive gap), which is missing, not zero load.
    """

    values: FloatArray
    start: np.datetime64

    def __post_init__(self) -> None:
        values = np.asarray(self.values, dtype=np.float64)
        if values.ndim != 1:
            raise ForecasterError("history values must be one-dimensional")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "start", np.array(self.start, dtype="datetime64[m]")[()])

    def __len__(self) -> int:
        return int(self.values.shape[0])

    @property
    def start_minute(self) -> int:
        """Minutes since the Unix epoch of the first value."""
        return int(self.start.astype(np.int64))

    def epoch_minutes(self, offset: int = 0, count: int | None = None) -> NDArray[np.int64]:
        """Epoch minutes of positions offset .. offset+count (may run past the end)."""
        n = len(self) - offset if count is None else count
        return np.arange(n, dtype=np.int64) + self.start_minute + offset

    @property
    def times(self) -> NDArray[np.datetime64]:
        return self.epoch_minutes().astype("datetime64[m]")

    def window(self, begin: int, end: int) -> History:
        """The sub-history of positions [begin, end), keeping timestamps right."""
        begin = max(0, begin)
        return History(self.values[begin:end], self.start + np.timedelta64(begin, "m"))

    def head(self, n: int) -> History:
        return self.window(0, n)

    def tail(self, n: int) -> History:
        return self.window(len(self) - n, len(self))

    def filled(self) -> FloatArray:
        """Values with gaps linearly interpolated (ends held), for models that need a grid.

        Interpolating across a gap keeps the level of the neighbouring data instead
        of feeding the model a spurious drop to zero.
        """
        return fill_gaps(self.values)

    @property
    def observed(self) -> FloatArray:
        """Only the non-missing values."""
        return self.values[np.isfinite(self.values)]


def fill_gaps(values: FloatArray) -> FloatArray:
    """Linear interpolation over NaN runs; leading/trailing runs take the nearest value."""
    out = np.array(values, dtype=np.float64)
    bad = ~np.isfinite(out)
    if not bad.any():
        return out
    if bad.all():
        return np.zeros_like(out)
    idx = np.arange(out.shape[0])
    out[bad] = np.interp(idx[bad], idx[~bad], out[~bad])
    return out


def minute_of_day(epoch_minutes: NDArray[np.int64]) -> NDArray[np.int64]:
    return epoch_minutes % MINUTES_PER_DAY


def day_of_week(epoch_minutes: NDArray[np.int64]) -> NDArray[np.int64]:
    """Monday = 0."""
    return (epoch_minutes // MINUTES_PER_DAY + _EPOCH_WEEKDAY) % 7


JsonScalar = str | int | float | bool | None


@dataclass(frozen=True)
class RiseOutlook:
    """Rises a forecaster foresees but leaves out of its forecast: per step, the chance
    one is under way and the rate it would bring. Whether one is worth buying for is a
    price question the planner answers (``provisioner.foreseen_rise``)."""

    chance: FloatArray
    rate: FloatArray

    def __post_init__(self) -> None:
        chance = np.clip(np.nan_to_num(np.asarray(self.chance, np.float64)), 0.0, 1.0)
        rate = np.maximum(np.nan_to_num(np.asarray(self.rate, np.float64)), 0.0)
        if chance.ndim != 1 or chance.shape != rate.shape:
            raise ForecasterError("a rise outlook needs one chance and one rate per step")
        object.__setattr__(self, "chance", chance)
        object.__setattr__(self, "rate", rate)


class Forecaster(ABC):
    """Fit once on a long history; forecast step maxima from any later history.

    Subclasses implement `_fit` and `_forecast`, and list in `params()` the
    constructor arguments and in `get_state()`/`set_state()` what fitting
    learned, so that one generic `save`/`load` works for every model
    (numpy arrays in an `.npz`, no pickle, so loading a file runs no code).
    """

    name: ClassVar[str] = ""

    def __init__(self) -> None:
        self.fitted = False

    def fit(self, history: History) -> Self:
        """Learn from `history`; returns self so `create(...).fit(h)` reads well."""
        if history.observed.size == 0:
            raise ForecasterError("cannot fit on a history with no observed values")
        self._fit(history)
        self.fitted = True
        return self

    def forecast(self, history: History, steps: int) -> FloatArray:
        """Predicted maximum rate of each of the next `steps` minutes after `history`.

        Always shape (steps,), finite and >= 0: a model that returns garbage for a
        step falls back to the last observed rate there, because the planner buys
        capacity from this array and cannot reason about NaN.
        """
        if steps < 1:
            raise ForecasterError(f"steps must be >= 1, got {steps}")
        if history.observed.size == 0:
            raise ForecasterError("cannot forecast from a history with no observed values")
        if not self.fitted:
            raise ForecasterError(f"model {self.name!r} must be fitted before forecasting")
        raw = np.asarray(self._forecast(history, steps), dtype=np.float64).reshape(-1)
        if raw.shape[0] != steps:
            raise ForecasterError(f"model {self.name!r} returned {raw.shape[0]} steps, not {steps}")
        fallback = float(history.observed[-1])
        raw = np.where(np.isfinite(raw), raw, fallback)
        return np.maximum(raw, 0.0)

    def rises(self, history: History, steps: int) -> RiseOutlook | None:
        """The rises this model foresees in the next `steps` minutes but leaves out of
        `forecast` (a median: a rise on some days is not the median day); None when it
        foresees none, as most models do."""
        return None

    def _fit(self, history: History) -> None:  # noqa: B027 - optional hook, no-op by default
        """Learn parameters; models without any leave this alone."""

    @abstractmethod
    def _forecast(self, history: History, steps: int) -> FloatArray:
        """Raw forecast; `forecast` validates and clips it."""

    def params(self) -> dict[str, JsonScalar]:
        """Constructor keyword arguments, so `load` can rebuild the model."""
        return {}

    def get_state(self) -> dict[str, FloatArray]:
        """Learned arrays; scalars go in as 0-d arrays."""
        return {}

    def set_state(self, state: dict[str, FloatArray]) -> None:  # noqa: B027 - no state by default
        """Restore what `get_state` returned."""

    def save(self, path: str | Path) -> Path:
        """Write params and learned state to one `.npz` file; returns the path written."""
        if not self.fitted:
            raise ForecasterError("only a fitted model can be saved")
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_suffix(path.suffix + ".npz")
        cls = type(self)
        meta = {
            "format": FORMAT_VERSION,
            "class": f"{cls.__module__}:{cls.__qualname__}",
            "params": self.params(),
        }
        state = self.get_state()
        if "__meta__" in state:
            raise ForecasterError("state key __meta__ is reserved")
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, Any] = {"__meta__": np.array(json.dumps(meta)), **state}
        with path.open("wb") as fh:
            np.savez(fh, **arrays)
        return path

    @classmethod
    def from_saved(cls, params: dict[str, Any], state: dict[str, FloatArray]) -> Self:
        model = cls(**params)
        model.set_state(state)
        model.fitted = True
        return model
