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
    """Holt-Winters (level + additive season) on log1p(rate): a multiplicative daily season.

    The season starts from a robust profile (per-phase median over the fitted
    history, smoothed) instead of statsmodels' heuristic over the first two
    seasons: there, one burst becomes a permanent seasonal spike or dip
    (on the Twitter trace, forecasts fell to zero after every burst). `fit`
    estimates the smoothing weights; `forecast` re-filters the last
    `filter_minutes` from the profile with them. With fewer than
    `min_seasons` seasons of history the season is flat (simple smoothing).
    """

    name = "ets"

    def __init__(
        self,
        period: int = MINUTES_PER_DAY,
        fit_seasons: int = 7,
        filter_minutes: int = MINUTES_PER_DAY,
        smooth: int = 15,
        min_seasons: int = 2,
    ) -> None:
        super().__init__()
        self.period = period
        self.fit_seasons = max(1, fit_seasons)
        self.filter_minutes = max(2, filter_minutes)
        self.smooth = smooth
        self.min_seasons = min_seasons
        self.alpha = 0.5
        self.gamma = 0.0
        self.profile = np.zeros(period)

    def params(self) -> dict[str, JsonScalar]:
        return {
            "period": self.period,
            "fit_seasons": self.fit_seasons,
            "filter_minutes": self.filter_minutes,
            "smooth": self.smooth,
            "min_seasons": self.min_seasons,
        }

    @property
    def seasonal(self) -> bool:
        return bool(np.any(self.profile != 0))

    def _model(self, history: History) -> object:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        y = np.log1p(np.maximum(history.filled(), 0.0))
        phase = history.start_minute % self.period
        season = np.roll(self.profile, -phase)  # season[i] is the phase of y[i]
        k = min(60, y.shape[0], self.period)
        level = float(np.median(y[:k] - season[:k]))
        if self.seasonal:
            return ExponentialSmoothing(
                y,
                seasonal="add",
                seasonal_periods=self.period,
                initialization_method="known",
                initial_level=level,
                initial_seasonal=season,
            )
        return ExponentialSmoothing(y, initialization_method="known", initial_level=level)

    def _fit(self, history: History) -> None:
        history = history.tail(self.fit_seasons * self.period)
        self.profile = np.zeros(self.period)
        if len(history) >= self.min_seasons * self.period:
            y = np.log1p(history.values)
            phases = history.epoch_minutes() % self.period
            profile = _phase_profile(y, phases, self.period, self.smooth)
            self.profile = profile - profile.mean()
        with _quiet():
            res = self._model(history).fit()  # type: ignore[attr-defined]
        self.alpha = float(res.params["smoothing_level"])
        gamma = res.params.get("smoothing_seasonal")
        self.gamma = float(gamma) if gamma is not None and np.isfinite(gamma) else 0.0

    def _forecast(self, history: History, steps: int) -> FloatArray:
        with _quiet():
            model = self._model(history.tail(self.filter_minutes))
            kwargs: dict[str, object] = {"smoothing_level": self.alpha, "optimized": False}
            if self.seasonal:
                kwargs["smoothing_seasonal"] = self.gamma
            res = model.fit(**kwargs)  # type: ignore[attr-defined]
            return np.expm1(np.asarray(res.forecast(steps), dtype=np.float64))

    def get_state(self) -> dict[str, FloatArray]:
        return {
            "alpha": np.asarray(self.alpha),
            "gamma": np.asarray(self.gamma),
            "profile": self.profile,
        }

    def set_state(self, state: dict[str, FloatArray]) -> None:
        self.alpha = float(state["alpha"])
        self.gamma = float(state["gamma"])
        self.profile = np.asarray(state["profile"], dtype=np.float64)


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
        if len(history) >= self.min_profile_days * MINUTES_PER_DAY:
            mod = minute_of_day(history.epoch_minutes())
            self.profile = _phase_profile(
                np.log1p(history.values), mod, MINUTES_PER_DAY, self.smooth
            )
        else:
            self.profile = np.full(MINUTES_PER_DAY, float(np.median(np.log1p(history.observed))))
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


def _phase_profile(y: FloatArray, phases: np.ndarray, period: int, smooth: int) -> FloatArray:
    """Median of y per phase (NaN ignored), gaps filled around the circle, then smoothed."""
    prof = np.full(period, np.nan)
    ok = np.isfinite(y)
    order = np.argsort(phases[ok], kind="stable")
    ys, ps = y[ok][order], phases[ok][order]
    bounds = np.searchsorted(ps, np.arange(period + 1))
    for p in range(period):
        if bounds[p + 1] > bounds[p]:
            prof[p] = np.median(ys[bounds[p] : bounds[p + 1]])
    if np.isnan(prof).all():
        prof[:] = np.median(ys) if ys.size else 0.0
    return _circular_smooth(_fill_circular(prof), smooth)


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
