"""Statistical forecasters on statsmodels: Holt-Winters and a seasonally adjusted ARIMA.

Both learn their parameters once in `fit` and, at forecast time, only run the
filter with those parameters over a recent tail of the history, so a forecast
costs milliseconds and stays a pure function of (parameters, history).
A daily season of 1,440 minutes is too long for a state-space SARIMA, so the
"sarima" model removes a learned daily profile and fits an ARMA to the rest.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from predictor.base import (
    MINUTES_PER_DAY,
    FloatArray,
    Forecaster,
    History,
    JsonScalar,
    minute_of_day,
)


@contextmanager
def _quiet() -> Iterator[None]:
    """statsmodels warns about convergence and index frequency on every call."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class HoltWinters(Forecaster):
    """Additive Holt-Winters with a daily season (simple smoothing below two seasons).

    `fit_seasons` bounds the fitting cost; `filter_seasons` is the tail
    re-filtered at each forecast (at least two, for the seasonal initialisation).
    """

    name = "ets"

    def __init__(
        self, period: int = MINUTES_PER_DAY, fit_seasons: int = 7, filter_seasons: int = 3
    ) -> None:
        super().__init__()
        self.period = period
        self.fit_seasons = max(2, fit_seasons)
        self.filter_seasons = max(2, filter_seasons)
        self.alpha = 0.5
        self.gamma = 0.0

    def params(self) -> dict[str, JsonScalar]:
        return {
            "period": self.period,
            "fit_seasons": self.fit_seasons,
            "filter_seasons": self.filter_seasons,
        }

    def _seasonal(self, n: int) -> bool:
        return n >= 2 * self.period + 10

    def _model(self, y: FloatArray) -> object:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        if self._seasonal(y.shape[0]):
            return ExponentialSmoothing(
                y,
                seasonal="add",
                seasonal_periods=self.period,
                initialization_method="heuristic",
            )
        return ExponentialSmoothing(y, initialization_method="known", initial_level=y[0])

    def _fit(self, history: History) -> None:
        y = history.filled()[-self.fit_seasons * self.period - 10 :]
        with _quiet():
            res = self._model(y).fit()  # type: ignore[attr-defined]
        self.alpha = float(res.params["smoothing_level"])
        gamma = res.params.get("smoothing_seasonal")
        self.gamma = float(gamma) if gamma is not None and np.isfinite(gamma) else 0.0

    def _forecast(self, history: History, steps: int) -> FloatArray:
        y = history.filled()[-self.filter_seasons * self.period - 10 :]
        with _quiet():
            model = self._model(y)
            kwargs = {"smoothing_level": self.alpha, "optimized": False}
            if self._seasonal(y.shape[0]):
                kwargs["smoothing_seasonal"] = self.gamma
            res = model.fit(**kwargs)  # type: ignore[attr-defined]
            return np.asarray(res.forecast(steps), dtype=np.float64)

    def get_state(self) -> dict[str, FloatArray]:
        return {"alpha": np.asarray(self.alpha), "gamma": np.asarray(self.gamma)}

    def set_state(self, state: dict[str, FloatArray]) -> None:
        self.alpha = float(state["alpha"])
        self.gamma = float(state["gamma"])


class SeasonalArima(Forecaster):
    """log1p(rate) = daily profile + ARMA(p, q) with a constant.

    The profile is the per-minute-of-day median over the fitted history,
    smoothed over `smooth` minutes; with under `min_profile_days` of history a
    "profile" would just memorise one day's noise, so it is flat. The ARMA is
    fitted on the last `fit_days` of deviations and re-filtered over
    `filter_minutes` at forecast; its forecast is clipped to the range of
    deviations seen in fitting, so a near-unit-root fit cannot explode.
    """

    name = "sarima"

    def __init__(
        self,
        p: int = 2,
        q: int = 1,
        fit_days: int = 3,
        filter_minutes: int = 360,
        smooth: int = 15,
        min_profile_days: int = 2,
    ) -> None:
        super().__init__()
        self.p, self.q = p, q
        self.fit_days = fit_days
        self.filter_minutes = filter_minutes
        self.smooth = smooth
        self.min_profile_days = min_profile_days
        self.bounds = np.array([-np.inf, np.inf])
        self.profile = np.zeros(MINUTES_PER_DAY)
        self.arma = np.zeros(0)

    def params(self) -> dict[str, JsonScalar]:
        return {
            "p": self.p,
            "q": self.q,
            "fit_days": self.fit_days,
            "filter_minutes": self.filter_minutes,
            "smooth": self.smooth,
            "min_profile_days": self.min_profile_days,
        }

    def _deviation(self, history: History) -> FloatArray:
        mod = minute_of_day(history.epoch_minutes())
        return np.log1p(history.filled()) - self.profile[mod]

    def _model(self, r: FloatArray) -> object:
        from statsmodels.tsa.statespace.sarimax import SARIMAX

        return SARIMAX(r, order=(self.p, 0, self.q), trend="c")

    def _fit(self, history: History) -> None:
        y = np.log1p(history.values)
        mod = minute_of_day(history.epoch_minutes())
        sums = np.full(MINUTES_PER_DAY, np.nan)
        for m in range(MINUTES_PER_DAY):
            vals = y[mod == m]
            vals = vals[np.isfinite(vals)]
            if vals.size:
                sums[m] = np.median(vals)
        if np.isnan(sums).all() or len(history) < self.min_profile_days * MINUTES_PER_DAY:
            sums[:] = np.nanmedian(y)
        self.profile = _circular_smooth(_fill_circular(sums), self.smooth)
        r = self._deviation(history)[-self.fit_days * MINUTES_PER_DAY :]
        self.bounds = np.array([r.min(), r.max()])
        with _quiet():
            res = self._model(r).fit(disp=False)  # type: ignore[attr-defined]
        self.arma = np.asarray(res.params, dtype=np.float64)

    def _forecast(self, history: History, steps: int) -> FloatArray:
        tail = history.tail(self.filter_minutes)
        r = self._deviation(tail)
        with _quiet():
            res = self._model(r).filter(self.arma)  # type: ignore[attr-defined]
            raw = np.asarray(res.forecast(steps), dtype=np.float64)
        dev: FloatArray = np.clip(raw, self.bounds[0], self.bounds[1])
        future = minute_of_day(tail.epoch_minutes(len(tail), steps))
        return np.expm1(self.profile[future] + dev)

    def get_state(self) -> dict[str, FloatArray]:
        return {"profile": self.profile, "arma": self.arma, "bounds": self.bounds}

    def set_state(self, state: dict[str, FloatArray]) -> None:
        self.profile = np.asarray(state["profile"], dtype=np.float64)
        self.arma = np.asarray(state["arma"], dtype=np.float64)
        self.bounds = np.asarray(state["bounds"], dtype=np.float64)


def _fill_circular(x: FloatArray) -> FloatArray:
    """Interpolate NaN around the day's circle (minute 1439 neighbours minute 0)."""
    n = x.shape[0]
    good = np.flatnonzero(np.isfinite(x))
    if good.size == n:
        return x
    xp = np.concatenate((good - n, good, good + n))
    return np.interp(np.arange(n), xp, np.tile(x[good], 3))


def _circular_smooth(x: FloatArray, width: int) -> FloatArray:
    if width <= 1:
        return x
    kernel = np.ones(width) / width
    padded = np.concatenate((x[-width:], x, x[:width]))
    return np.convolve(padded, kernel, mode="same")[width:-width]
