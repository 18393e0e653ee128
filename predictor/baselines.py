"""Naive forecasters: the bar any learned model has to clear."""

from __future__ import annotations

import numpy as np

from predictor.base import (
    MINUTES_PER_DAY,
    MINUTES_PER_WEEK,
    FloatArray,
    Forecaster,
    History,
    JsonScalar,
)


class LastValue(Forecaster):
    """Repeat the last observed rate: right when load is flat, lags every change."""

    name = "last"

    def _forecast(self, history: History, steps: int) -> FloatArray:
        return np.full(steps, history.observed[-1])


class SeasonalNaive(Forecaster):
    """Repeat the rate one period ago (default: the same minute yesterday).

    Gaps in that earlier period are interpolated; with less than one period of
    history it degrades to the last value.
    """

    name = "seasonal"

    def __init__(self, period: int = MINUTES_PER_DAY) -> None:
        super().__init__()
        if period < 1:
            raise ValueError("period must be >= 1")
        self.period = period

    def params(self) -> dict[str, JsonScalar]:
        return {"period": self.period}

    def _forecast(self, history: History, steps: int) -> FloatArray:
        n = len(history)
        if n < self.period:
            return np.full(steps, history.observed[-1])
        values = history.filled()
        # Step k (0-based) is position n + k; go back whole periods until it is in the past.
        pos = n + np.arange(steps)
        back = (pos - (n - 1) + self.period - 1) // self.period
        return np.asarray(values[pos - back * self.period], dtype=np.float64)


class SeasonalNaiveWeek(SeasonalNaive):
    """The same minute last week: catches weekday/weekend shape, needs a week of history."""

    name = "seasonal-week"

    def __init__(self, period: int = MINUTES_PER_WEEK) -> None:
        super().__init__(period)


class PaperFallback(Forecaster):
    """The MArk prototype's rule after warm-up: `factor` x the highest rate seen so far.

    Never under-predicts a load it has seen, and pays for the peak all day.
    With ``window`` (minutes) it is the issue's fallback instead: `factor` x the
    highest rate of the last ``window`` minutes, nothing remembered, so a
    fallback serving before a model is trained lets the fleet shrink once a
    peak is ``window`` minutes old.
    """

    name = "paper"

    def __init__(self, factor: float = 1.2, window: int | None = None) -> None:
        super().__init__()
        if factor <= 0:
            raise ValueError("factor must be > 0")
        if window is not None and window < 1:
            raise ValueError("window must be >= 1 minute")
        self.factor = factor
        self.window = window
        self.peak = 0.0

    def params(self) -> dict[str, JsonScalar]:
        return {"factor": self.factor, "window": self.window}

    def _fit(self, history: History) -> None:
        self.peak = 0.0 if self.window is not None else float(history.observed.max())

    def _forecast(self, history: History, steps: int) -> FloatArray:
        if self.window is None:
            peak = max(self.peak, float(history.observed.max()))
        else:
            recent = history.tail(self.window).observed
            peak = float(recent.max()) if recent.size else 0.0
        return np.full(steps, self.factor * peak)

    def get_state(self) -> dict[str, FloatArray]:
        return {"peak": np.asarray(self.peak)}

    def set_state(self, state: dict[str, FloatArray]) -> None:
        self.peak = float(state["peak"])
