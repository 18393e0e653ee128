"""A calendar of recurring rises around another forecaster (``lstm-calendar``).

Why: load driven by schedules (cron jobs, bots posting on the half hour) jumps
within a minute to several times its level, at the same clock minute on most
days. A forecaster that reads the last hour cannot see such a rise coming, and
capacity bought when it starts serves only after the boot, so the rise's first
minutes go to Lambda at several times an instance's price per request. A median
forecaster (the LSTM) does not learn a rise seen on a handful of days either: a
rise on half the days at 01:32 is one example a day among 1,440 minutes.

The rule, which keeps the inner forecaster's median semantics: a rise starts at
a minute whose peak is at least ``jump`` times the median of the
``base_minutes`` before it (and none started in the ``length`` before). A rise
is forecast at minute m of the day when one started at m on at least ``share``
(a half: a median) of the full days of the history the model was fitted on, at
least ``min_days`` of them, shaped as the median past rise over the current
base. The inner forecast stands wherever it is higher, and alone while a rise is
under way (the inner model sees it). A trace without recurring rises learns an
empty calendar and forecasts as the inner model does.

Measured on the Twitter trace (experiments/table5/README.md): a tenth off
mark-spot's bill on day 10, nothing on day 12 on demand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from predictor.base import (
    MINUTES_PER_DAY,
    FloatArray,
    Forecaster,
    ForecasterError,
    History,
    JsonScalar,
)


def rise_starts(
    values: FloatArray, jump: float, base_minutes: int, length: int
) -> NDArray[np.bool_]:
    """The minutes at which a rise starts: a peak ``jump`` times the median of the
    ``base_minutes`` before it, with no start in the ``length`` minutes before."""
    starts = np.zeros(values.shape[0], dtype=bool)
    last = -length - 1
    for i in range(base_minutes, values.shape[0]):
        if i - last > length and values[i] >= jump * np.median(values[i - base_minutes : i]):
            starts[i] = True
            last = i
    return starts


@dataclass(frozen=True)
class Calendar:
    """For each minute of the day, the share of the days seen on which a rise started
    there; and the median rise over its base, minute by minute."""

    share: FloatArray  # (MINUTES_PER_DAY,)
    shape: FloatArray  # (length,)
    days: int


def learn(
    history: History, *, jump: float, base_minutes: int, length: int, min_days: int
) -> Calendar:
    """The calendar of ``history``'s full days (empty with fewer than ``min_days``)."""
    x = history.filled()
    starts = rise_starts(x, jump, base_minutes, length)
    minute = history.epoch_minutes()
    day = minute // MINUTES_PER_DAY
    days, per_day = np.unique(day, return_counts=True)
    full = set(days[per_day == MINUTES_PER_DAY].tolist())
    counts = np.zeros(MINUTES_PER_DAY)
    shapes = []
    for i in np.flatnonzero(starts):
        if int(day[i]) in full:
            counts[minute[i] % MINUTES_PER_DAY] += 1
        if i + length <= x.shape[0]:
            shapes.append(x[i : i + length] / max(float(np.median(x[i - base_minutes : i])), 1e-9))
    n = len(full)
    share = counts / n if n >= min_days else np.zeros(MINUTES_PER_DAY)
    shape = np.median(np.array(shapes), axis=0) if shapes else np.ones(length)
    return Calendar(share, np.asarray(shape, dtype=np.float64), n)


def raise_forecast(
    calendar: Calendar,
    forecast: FloatArray,
    history: History,
    *,
    jump: float,
    base_minutes: int,
    share: float,
) -> FloatArray:
    """``forecast`` (the steps after ``history``) raised where ``calendar`` foresees a
    rise starting at one of those steps, unless a rise is under way already."""
    x = history.filled()
    if x.shape[0] < base_minutes + 1:
        return forecast
    base = float(np.median(x[-base_minutes:]))
    if x[-1] >= jump * base:
        return forecast  # under way: the inner model sees it
    out = np.array(forecast, dtype=np.float64)
    first = history.start_minute + len(history)  # the minute of step 0
    length = calendar.shape.shape[0]
    for h in np.flatnonzero(
        calendar.share[(first + np.arange(out.shape[0])) % MINUTES_PER_DAY] >= share
    ):
        end = min(out.shape[0], h + length)
        out[h:end] = np.maximum(out[h:end], base * calendar.shape[: end - h])
    return out


class RiseCalendarForecaster(Forecaster):
    """The ``inner`` forecaster, with the rises its calendar foresees (module docstring)."""

    name = "lstm-calendar"

    def __init__(
        self,
        inner: str = "lstm",
        jump: float = 2.0,
        base_minutes: int = 15,
        length: int = 10,
        share: float = 0.5,
        min_days: int = 3,
    ) -> None:
        super().__init__()
        if jump <= 1.0 or base_minutes < 1 or length < 1 or min_days < 1:
            raise ValueError("need jump > 1, base_minutes >= 1, length >= 1, min_days >= 1")
        if not 0.0 < share <= 1.0:
            raise ValueError("need 0 < share <= 1")
        from predictor.registry import create

        self.inner_spec = inner
        self.inner = create(inner)
        self.jump = jump
        self.base_minutes = base_minutes
        self.length = length
        self.share = share
        self.min_days = min_days
        self.calendar = Calendar(np.zeros(MINUTES_PER_DAY), np.ones(length), 0)

    def params(self) -> dict[str, JsonScalar]:
        return {
            "inner": self.inner_spec,
            "jump": self.jump,
            "base_minutes": self.base_minutes,
            "length": self.length,
            "share": self.share,
            "min_days": self.min_days,
        }

    def _fit(self, history: History) -> None:
        self.inner.fit(history)
        self.calendar = learn(
            history,
            jump=self.jump,
            base_minutes=self.base_minutes,
            length=self.length,
            min_days=self.min_days,
        )

    def _forecast(self, history: History, steps: int) -> FloatArray:
        return raise_forecast(
            self.calendar,
            self.inner.forecast(history, steps),
            history,
            jump=self.jump,
            base_minutes=self.base_minutes,
            share=self.share,
        )

    def get_state(self) -> dict[str, FloatArray]:
        inner = {f"inner.{k}": v for k, v in self.inner.get_state().items()}
        return {
            **inner,
            "calendar.share": self.calendar.share,
            "calendar.shape": self.calendar.shape,
            "calendar.days": np.asarray(float(self.calendar.days)),
        }

    def set_state(self, state: dict[str, FloatArray]) -> None:
        self.inner.set_state(
            {k.removeprefix("inner."): v for k, v in state.items() if k.startswith("inner.")}
        )
        self.inner.fitted = True
        days = int(state["calendar.days"])
        self.calendar = Calendar(
            np.asarray(state["calendar.share"], dtype=np.float64),
            np.asarray(state["calendar.shape"], dtype=np.float64),
            days,
        )
        if self.calendar.share.shape != (MINUTES_PER_DAY,):
            raise ForecasterError("a saved calendar must have one share per minute of the day")
