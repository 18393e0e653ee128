"""The load history the forecasters read, and the forecast per control step.

Arrivals are stored per P_s window; the paper's series is the highest rate of
each minute. The history slides with ``now`` instead of being cut at clock
minutes, so with P_u < 60 s each step sees the last 60 s as its latest minute.
A minute with no window stored is missing (NaN), not zero load: the daemon
records every window it was running for, empty ones as zeros.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from bouncer.miss_budget import MissTally
from mark.ports import Store
from mark.state.records import ArrivalWindow
from predictor.base import Forecaster, History
from predictor.baselines import PaperFallback
from predictor.online import COLD_START_WINDOW, OnlinePredictor
from provisioner.control_state import Rise, StepConfig
from provisioner.rise_headroom import rise_to_carry


def _columns(windows: Sequence[ArrivalWindow]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start, length and rate of each window, as arrays (a day's history is ~17k windows,
    read every step: a Python loop over them was a fifth of a simulated run)."""
    n = len(windows)
    start = np.fromiter((w.window_start for w in windows), float, n)
    length = np.fromiter((w.window_s for w in windows), float, n)
    count = np.fromiter((w.count for w in windows), float, n)
    return start, length, count / length


_EMPTY = (np.empty(0), np.empty(0), np.empty(0))


def _max_into(n: int, k: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """Per slot ``0..n-1``, the highest ``rate`` whose ``k`` is that slot; -inf if none."""
    out = np.full(n, -np.inf)
    inside = (k >= 0) & (k < n)
    np.maximum.at(out, k[inside], rate[inside])
    return out


def _minute_max(at: np.ndarray, rate: np.ndarray, start: float, minutes: int) -> list[float]:
    out = _max_into(minutes, np.floor((at - start) / 60.0).astype(np.int64), rate)
    out[np.isneginf(out)] = math.nan
    return [float(x) for x in out]


def max_rate_per_minute(
    windows: Sequence[ArrivalWindow], start: float, minutes: int
) -> list[float]:
    """For each minute from ``start``, the highest rate of its windows; NaN if none."""
    if not windows:
        return [math.nan] * minutes
    at, _, rate = _columns(windows)
    return _minute_max(at, rate, start, minutes)


class StepForecast(NamedTuple):
    """What the planner reads of the forecaster, per control step."""

    values: list[float]
    """The forecast max rate."""
    peak: float
    """The highest rate observed in the history it was made from."""
    rise_chance: list[float]
    """The chance a rise the forecast leaves out is under way (empty: none foreseen)."""
    rise_rate: list[float]
    """The rate that rise would bring."""


def cold_start_forecaster() -> Forecaster:
    """The forecaster used when no predictor is configured for a model: the paper's
    fallback over the last hour (``predictor.baselines.PaperFallback``)."""
    return PaperFallback(window=COLD_START_WINDOW)


@dataclass
class LoadHistory:
    """Per-model history from the store, cached between steps, and the forecast from it."""

    store: Store
    history_minutes: int
    step_s: float
    predictors: Mapping[str, OnlinePredictor] = field(default_factory=dict)
    fallback: Forecaster = field(default_factory=cold_start_forecaster)
    fit_minutes: int = 0
    """History a refit learns from, read from the store only when one starts (0: the
    forecast's ``history_minutes``)."""
    _series: dict[str, dict[float, ArrivalWindow]] = field(default_factory=dict)
    _fetched: dict[str, float] = field(default_factory=dict)
    _cols: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    """``_series`` as columns (start, length, rate), kept in step with it: each step
    replaces only what it read again (``_keep_columns``)."""

    def _keep_columns(
        self, model: str, since: float, start: float, read: Sequence[ArrivalWindow]
    ) -> None:
        """The columns after a read of ``[since, now)``: what was kept before ``since`` and
        what was read, without what fell out before ``start``. If that does not match the
        series one for one (a store that returned other windows), built again from it."""
        series = self._series[model]
        cols = self._cols.get(model)
        if cols is not None and read:
            at, length, rate = cols
            keep = (at < since) & (at >= start)
            new = _columns(read)
            cols = (
                np.concatenate([at[keep], new[0]]),
                np.concatenate([length[keep], new[1]]),
                np.concatenate([rate[keep], new[2]]),
            )
        elif cols is not None:
            at, length, rate = cols
            keep = at >= start
            cols = (at[keep], length[keep], rate[keep])
        if cols is None or cols[0].size != len(series):
            cols = _columns(list(series.values())) if series else _EMPTY
        self._cols[model] = cols

    def columns(self, model: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Start, length and rate of every window as last read by ``minutes``."""
        return self._cols.get(model, _EMPTY)

    async def minutes(self, model: str, now: float) -> tuple[float, list[float]]:
        """Max rate per minute of the last ``history_minutes`` minutes, the last ending now.

        Only windows since the last call (and two minutes before, for late ones)
        are read from the store; older ones are kept in memory.
        """
        start = now - self.history_minutes * 60.0
        cache = self._series.setdefault(model, {})
        since = max(start, self._fetched.get(model, start) - 120.0)
        read = await self.store.arrivals(model, since, now)
        for w in read:
            cache[w.window_start] = w
        self._fetched[model] = now
        for key in [k for k in cache if k < start]:
            del cache[key]
        self._keep_columns(model, since, start, read)
        at, _, rate = self.columns(model)
        if not at.size:
            return start, [math.nan] * self.history_minutes
        return start, _minute_max(at, rate, start, self.history_minutes)

    def window_minutes(self, model: str, now: float, minutes: int = 60) -> list[list[float]]:
        """The window rates of each of the last ``minutes`` whole minutes before ``now``, as
        last read by ``minutes``/``forecast`` (the within-step shape the capacity target
        measures)."""
        end = math.floor(now / 60.0) * 60.0
        start = end - minutes * 60.0
        grouped: dict[int, list[float]] = {}
        for w in self._series.get(model, {}).values():
            if start <= w.window_start < end:
                grouped.setdefault(int((w.window_start - start) // 60.0), []).append(w.rate)
        return [grouped[k] for k in sorted(grouped)]

    def recent_rates(self, model: str, now: float, minutes: int = 60) -> tuple[float, list[float]]:
        """The P_s window length and the rates of the windows closed by ``now`` over the last
        ``minutes``, newest first, one per window (0 where none is stored: no request
        came), as last read by ``minutes``/``forecast`` (``provisioner.early_step``)."""
        at, length, rate = self.columns(model)
        if not at.size:
            return 60.0, []
        window_s = float(length.min())
        n = max(0, math.floor(minutes * 60.0 / window_s))
        k = np.floor((now - (at + length)) / window_s + 1e-9).astype(np.int64)
        return window_s, [float(x) for x in np.maximum(_max_into(n, k, rate), 0.0)]

    def window_grid(self, model: str, start: float, minutes: int) -> np.ndarray:
        """The window rates of ``minutes`` minutes from ``start`` as last read by
        ``minutes``: a minutes × windows-per-minute array, NaN where none is stored."""
        starts, length, rate = self.columns(model)
        window_s = float(length.min()) if length.size else 60.0
        per = max(1, round(60.0 / window_s))
        grid = np.full((minutes, per), np.nan)
        at = starts - start
        k = np.floor(at / 60.0).astype(np.int64)
        j = np.clip(np.floor((at - 60.0 * k) / window_s).astype(np.int64), 0, per - 1)
        inside = (k >= 0) & (k < minutes)
        grid[k[inside], j[inside]] = rate[inside]
        return grid

    async def rise_to_carry(
        self, model: str, now: float, cfg: StepConfig, misses: MissTally
    ) -> Rise | None:
        """The rise a pool sized for rises carries over this history, given the last
        window's measured ``misses`` (``provisioner.rise_headroom.rise_to_carry``)."""
        start, _ = await self.minutes(model, now)
        grid = self.window_grid(model, start, self.history_minutes)
        return rise_to_carry(grid, cfg, misses)

    async def forecast(
        self,
        model: str,
        now: float,
        steps: int,
    ) -> StepForecast:
        """The forecast max rate for each of the next ``steps`` control steps (P_u each),
        the highest rate observed in the history it was made from, and the rises the
        forecaster foresees beside it (``Forecaster.rises``).

        Forecasters speak per minute;
        with P_u < 60 s each minute's value covers the steps inside it, so the
        planner's τ and cool-down arithmetic, which count in steps, read the forecast
        on the right time axis.
        """
        start, values = await self.minutes(model, now)
        history = History(
            np.asarray(values, dtype=np.float64), np.datetime64(int(start // 60), "m")
        )
        observed = history.observed
        peak = float(observed.max()) if observed.size else 0.0
        if peak <= 0.0:  # nothing seen yet, or only idle minutes: no load to plan for
            return StepForecast([0.0] * steps, peak, [], [])
        per_minute_count = math.ceil(steps * self.step_s / 60.0)
        online = self.predictors.get(model)
        if online is None:
            if not self.fallback.fitted:
                self.fallback.fit(history)
            raw = self.fallback.forecast(history, per_minute_count)
            rises = None
        else:
            if online.due(int(observed.size), int(now // 60)):
                online.maybe_refit(await self._fit_history(model, now, history), int(now // 60))
            raw = online.forecast(history, per_minute_count)
            rises = online.rises(history, per_minute_count)

        def per_step(per_minute: Sequence[float]) -> list[float]:
            last = len(per_minute) - 1
            return [
                float(per_minute[min(int(k * self.step_s // 60.0), last)]) for k in range(steps)
            ]

        if rises is None:
            return StepForecast(per_step(list(raw)), peak, [], [])
        return StepForecast(
            per_step(list(raw)),
            peak,
            per_step(list(rises.chance)),
            per_step(list(rises.rate)),
        )

    async def _fit_history(self, model: str, now: float, history: History) -> History:
        """The last ``fit_minutes`` minutes for a refit, from the first observed one (a
        daemon younger than that has nothing earlier to learn from); read once per refit
        and not kept."""
        if self.fit_minutes <= self.history_minutes:
            return history
        start = now - self.fit_minutes * 60.0
        windows = await self.store.arrivals(model, start, now)
        values = np.asarray(max_rate_per_minute(windows, start, self.fit_minutes), np.float64)
        first = int(np.argmax(np.isfinite(values))) if np.isfinite(values).any() else 0
        return History(values[first:], np.datetime64(int(start // 60) + first, "m"))
