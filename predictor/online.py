"""Serving forecasts every P_u while refits run off the control loop.

The control loop must answer every minute; fitting an LSTM takes a minute or
more. So the loop always forecasts from the model it has, and a refit, when
the schedule says so, builds a *new* model in an executor and swaps it in
when done. A failed refit keeps the old model. Time comes in as an argument
(epoch minutes), never from a clock, so the simulator can drive it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from predictor.base import MINUTES_PER_DAY, FloatArray, Forecaster, History, RiseOutlook
from predictor.baselines import PaperFallback

COLD_START_WINDOW = 60
"""Minutes of history the cold-start fallback takes its peak from."""


@dataclass(frozen=True)
class RefitPolicy:
    """Refit every `every_minutes` (nightly by default), once `min_history` observed minutes exist.

    `at_minute_of_day` pins refits to a quiet hour (UTC); None means "whenever due".
    """

    every_minutes: int = MINUTES_PER_DAY
    min_history: int = MINUTES_PER_DAY
    at_minute_of_day: int | None = 3 * 60

    def due(self, last_fit: int | None, now: int, history_minutes: int) -> bool:
        if history_minutes < self.min_history:
            return False
        if last_fit is None:
            return True  # the first model should not wait for the quiet hour
        if now - last_fit < self.every_minutes:
            return False
        if self.at_minute_of_day is None:
            return True
        # Due from the quiet minute on; the interval check above stops a second refit that day.
        return now % MINUTES_PER_DAY >= self.at_minute_of_day


class OnlinePredictor:
    """The current model, a cold-start fallback, and at most one refit in flight."""

    def __init__(
        self,
        make: Callable[[], Forecaster],
        policy: RefitPolicy | None = None,
        cold_start: Forecaster | None = None,
    ) -> None:
        self.make = make
        self.policy = policy or RefitPolicy()
        # Before any model is fitted, the fallback: 1.2 x the peak of the last hour. Not the
        # prototype's peak-ever, which would keep a morning's fleet until the first refit.
        self.cold_start = cold_start or PaperFallback(window=COLD_START_WINDOW)
        self.model: Forecaster | None = None
        self.last_fit: int | None = None
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def refitting(self) -> bool:
        return self._task is not None and not self._task.done()

    def forecast(self, history: History, steps: int = 60) -> FloatArray:
        """Forecast from the current model, or the cold-start rule before there is one."""
        if self.model is not None:
            return self.model.forecast(history, steps)
        if not self.cold_start.fitted:
            self.cold_start.fit(history)
        return self.cold_start.forecast(history, steps)

    def rises(self, history: History, steps: int = 60) -> RiseOutlook | None:
        """The rises the current model foresees beside its forecast; none before a model."""
        return self.model.rises(history, steps) if self.model is not None else None

    def due(self, observed: int, now: int) -> bool:
        """Whether a refit would start now, with `observed` minutes of history seen: so a
        caller can read a longer history for it only when it will be used."""
        return not self.refitting and self.policy.due(self.last_fit, now, observed)

    def maybe_refit(
        self, history: History, now: int, executor: Executor | None = None
    ) -> asyncio.Task[None] | None:
        """Start a refit in `executor` if one is due and none is running; never blocks."""
        # Observed minutes, not the grid's length: a history padded with minutes nobody
        # saw (before the daemon first ran) is not a day of data to learn from.
        if not self.due(int(history.observed.size), now):
            return None
        self._task = asyncio.get_running_loop().create_task(self._refit(history, now, executor))
        return self._task

    async def _refit(self, history: History, now: int, executor: Executor | None) -> None:
        loop = asyncio.get_running_loop()
        candidate = self.make()
        try:
            await loop.run_in_executor(executor, candidate.fit, history)
        except Exception as exc:  # a failed refit must not take the forecasts down with it
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.last_fit = now  # retry on the next schedule, not every minute
            return
        self.model, self.last_fit, self.last_error = candidate, now, None
