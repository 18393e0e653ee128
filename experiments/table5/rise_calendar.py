"""Ablation: the LSTM plus a calendar of recurring rises (a prototype, not part of mark).

Why it exists: on the Twitter trace the rises that cost mark its Lambda bill start at the
same clock minute on about half the days. A median forecaster cannot learn that from a
handful of examples; a calendar can. This script measures what such a calendar would save
before it is built into ``predictor/`` (see README, "Still open"). It is not shipped
because the daemon refits its forecaster on 25 hours of history and a calendar needs days.

The rule: a rise starts at minute i when its peak is at least ``JUMP`` times the median of
the ``BASE`` minutes before it (and none started in the ``LENGTH`` before). A rise is
forecast at minute m of the day when one started at m on at least half of the full days of
the training history (a median, like the LSTM's forecast), shaped as the median rise over
the current base; the LSTM's forecast stands wherever it is higher, and alone while a rise
is under way (the LSTM sees it).

    .venv/bin/python experiments/table5/rise_calendar.py --start-day 10 --model inception-v3

prints ``mark simulate --format json`` for mark and mark-spot with the LSTM (``--predictor
lstm``) wrapped in the calendar; other arguments are passed to ``mark simulate``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

import mark.cli.simulate_cmd as simulate_cmd
from mark.cli.main import app
from mark.sim.compare import history_of
from mark.sim.workloads import Workload
from predictor.base import MINUTES_PER_DAY, FloatArray, Forecaster, History

JUMP = 2.0  # a rise: at least twice ...
BASE = 15  # ... the median of this many minutes before it
LENGTH = 10  # minutes a rise's shape is kept for
SHARE = 0.5  # forecast where a rise started on at least this share of the days


def rise_starts(x: FloatArray) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Minutes at which a rise starts."""
    starts = np.zeros(x.size, dtype=bool)
    for i in range(BASE, x.size):
        if x[i] >= JUMP * np.median(x[i - BASE : i]) and not starts[max(0, i - LENGTH) : i].any():
            starts[i] = True
    return starts


class RiseCalendar(Forecaster):
    """``inner``'s forecast, raised where the calendar says a rise starts."""

    name = "lstm+rise-calendar"

    def __init__(self, inner: Forecaster, history: History) -> None:
        super().__init__()
        self.inner = inner
        x = history.filled()
        starts = rise_starts(x)
        day = (history.start_minute + np.arange(x.size)) // MINUTES_PER_DAY
        tod = (history.start_minute + np.arange(x.size)) % MINUTES_PER_DAY
        full = [d for d in np.unique(day) if np.count_nonzero(day == d) == MINUTES_PER_DAY]
        seen = np.zeros(MINUTES_PER_DAY)
        for i in np.flatnonzero(starts):
            if day[i] in full:
                seen[tod[i]] += 1
        self.share = seen / max(len(full), 1)
        shapes = [
            x[i : i + LENGTH] / np.median(x[i - BASE : i])
            for i in np.flatnonzero(starts)
            if i + LENGTH <= x.size
        ]
        self.shape = np.median(np.array(shapes), axis=0) if shapes else np.ones(LENGTH)
        self.fitted = True

    def _forecast(self, history: History, steps: int) -> FloatArray:
        out = np.array(self.inner.forecast(history, steps), dtype=np.float64)
        x = history.filled()
        base = float(np.median(x[-BASE:]))
        if x[-1] >= JUMP * base:  # a rise under way: the inner model sees it
            return out
        first = history.start_minute + len(history)  # the minute of step 0
        for h in range(steps):
            if self.share[(first + h) % MINUTES_PER_DAY] >= SHARE:
                end = min(steps, h + LENGTH)
                out[h:end] = np.maximum(out[h:end], base * self.shape[: end - h])
        return out


def main(argv: list[str]) -> None:
    train = simulate_cmd.train_forecaster

    def with_calendar(spec: str, workload: Workload, warmup_s: float, cache: Path) -> Forecaster:
        return RiseCalendar(train(spec, workload, warmup_s, cache), history_of(workload, warmup_s))

    simulate_cmd.train_forecaster = with_calendar  # type: ignore[assignment]
    args = ["--trace", "twitter", "--hours", "8", "--policies", "mark,mark-spot"]
    app(["simulate", *args, "--predictor", "lstm", "--format", "json", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
