"""A calendar of recurring rises around another forecaster (``lstm-calendar``).

Why: load driven by schedules (cron jobs, bots posting on the half hour) jumps
within a minute to several times its level, at the same clock minute on most
days. A forecaster that reads the last hour cannot see such a rise coming, and
capacity bought when it starts serves only after the boot, so the rise's first
minutes go to Lambda at several times an instance's price per request. A median
forecaster (the LSTM) does not learn a rise seen on a handful of days either: a
rise on half the days at 01:32 is one example a day among 1,440 minutes.

The rule: a rise starts at a minute whose peak is at least ``jump`` times the
median of the ``base_minutes`` before it (and none started in the ``length``
before). The forecast is the inner model's, a median: a rise that comes on some
days is not the median day. Beside it (``rises``) the calendar reports, for each
coming minute of the day at which a rise started on one of the full days fitted
on (at least ``min_days``), the chance one starts there again, measured out of
sample (``calibrated``: a minute picked out for its rises overstates its
chance) and at least ``share``, at the current base plus the median past rise
over its base, minute by minute: added, not multiplied, since scheduled load adds
itself to whatever else runs (on the Twitter archive the rises reach about the same
rate over a base of 50 r/s as over one of 90; multiplied, a rise over a higher base
was bought for half as much again as came). Nothing while a rise is under way (the
inner model sees it). Whether a foreseen rise is worth buying for is the planner's
price question (``provisioner.foreseen_rise``). A trace without recurring rises
foresees none and is the inner model.
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
    RiseOutlook,
)

STATE_VERSION = 2
"""What ``get_state`` writes: 2 since rises are added to the base (1, unmarked, held ratios
and is refused rather than misread)."""


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
    """For each minute of the day, the chance a rise starts there on a day to come, and
    whether one started there on any day seen; the median rise over its base, minute
    by minute, in requests/s added to the base."""

    chance: FloatArray  # (MINUTES_PER_DAY,)
    seen: NDArray[np.bool_]  # (MINUTES_PER_DAY,)
    shape: FloatArray  # (length,)
    days: int


def pooled_adjacent(hits: FloatArray, counts: FloatArray) -> FloatArray:
    """The non-decreasing rates ``hits/counts`` nearest them, weighted by ``counts``
    (isotonic regression by pooling adjacent violators); entries with no count take
    their pool's rate."""
    blocks: list[list[float]] = []  # [hits, counts, entries]
    for h, c in zip(hits.tolist(), counts.tolist(), strict=True):
        blocks.append([h, c, 1.0])
        while len(blocks) > 1 and _rate(blocks[-2]) > _rate(blocks[-1]):
            h2, c2, n2 = blocks.pop()
            blocks[-1] = [blocks[-1][0] + h2, blocks[-1][1] + c2, blocks[-1][2] + n2]
    return np.repeat([_rate(b) for b in blocks], [int(b[2]) for b in blocks])


def _rate(block: list[float]) -> float:
    return block[0] / block[1] if block[1] > 0 else 0.0


def calibrated(starts_by_day: NDArray[np.bool_]) -> FloatArray:
    """For each minute of the day, the chance a rise starts there on a day to come, from
    ``starts_by_day`` (days × minutes). Not the share of days it came on: picked out
    for coming often, a minute's share overstates its chance. Measured out of sample
    instead: leaving each day out in turn, how often a rise came at a minute where it
    had come on j of the other days, for every j (non-decreasing in j); a minute where
    it came on k of n days then reads that rate at j = k·(n−1)/n."""
    n = starts_by_day.shape[0]
    k = starts_by_day.sum(axis=0)
    hits = np.zeros(n)
    counts = np.zeros(n)
    for day in starts_by_day:
        others = k - day
        np.add.at(counts, others, 1.0)
        np.add.at(hits, others, day.astype(np.float64))
    rate = pooled_adjacent(hits, counts)
    return np.interp(k * (n - 1) / n, np.arange(n), rate) if n > 1 else np.zeros(k.shape)


def learn(
    history: History, *, jump: float, base_minutes: int, length: int, min_days: int
) -> Calendar:
    """The calendar of ``history``'s full days (empty with fewer than ``min_days``)."""
    x = history.filled()
    starts = rise_starts(x, jump, base_minutes, length)
    minute = history.epoch_minutes()
    day = minute // MINUTES_PER_DAY
    days, per_day = np.unique(day, return_counts=True)
    full = days[per_day == MINUTES_PER_DAY]
    by_day = np.zeros((full.shape[0], MINUTES_PER_DAY), dtype=bool)
    row = {int(d): r for r, d in enumerate(full.tolist())}
    shapes = []
    for i in np.flatnonzero(starts):
        if int(day[i]) in row:
            by_day[row[int(day[i])], minute[i] % MINUTES_PER_DAY] = True
        if i + length <= x.shape[0]:
            shapes.append(x[i : i + length] - float(np.median(x[i - base_minutes : i])))
    n = len(row)
    shape = np.median(np.array(shapes), axis=0) if shapes else np.zeros(length)
    shape = np.asarray(np.maximum(shape, 0.0), dtype=np.float64)
    if n < min_days:
        return Calendar(np.zeros(MINUTES_PER_DAY), np.zeros(MINUTES_PER_DAY, bool), shape, n)
    return Calendar(calibrated(by_day), np.asarray(by_day.any(axis=0), dtype=bool), shape, n)


def outlook(
    calendar: Calendar,
    history: History,
    steps: int,
    *,
    jump: float,
    base_minutes: int,
    share: float,
) -> RiseOutlook | None:
    """The rises ``calendar`` foresees in the ``steps`` minutes after ``history``: at
    each minute of the day where one started on a day seen and its chance is at least
    ``share``, for its length, at the current base plus the median rise. None while
    one is under way (the inner model sees it) or none is foreseen."""
    x = history.filled()
    if x.shape[0] < base_minutes + 1 or calendar.days == 0:
        return None
    base = float(np.median(x[-base_minutes:]))
    if x[-1] >= jump * base:
        return None
    first = history.start_minute + len(history)  # the minute of step 0
    length = calendar.shape.shape[0]
    chance = np.zeros(steps)
    rate = np.zeros(steps)
    of_day = (first + np.arange(steps)) % MINUTES_PER_DAY
    start_chance = calendar.chance[of_day]
    for h in np.flatnonzero(calendar.seen[of_day] & (start_chance >= share)):
        end = min(steps, h + length)
        higher = start_chance[h] > chance[h:end]
        chance[h:end] = np.where(higher, start_chance[h], chance[h:end])
        rate[h:end] = np.where(higher, base + calendar.shape[: end - h], rate[h:end])
    if not chance.any():
        return None
    return RiseOutlook(chance, rate)


class RiseCalendarForecaster(Forecaster):
    """The ``inner`` forecaster, with the rises its calendar foresees (module docstring)."""

    name = "lstm-calendar"

    def __init__(
        self,
        inner: str = "lstm",
        jump: float = 2.0,
        base_minutes: int = 15,
        length: int = 10,
        share: float = 0.0,
        min_days: int = 3,
    ) -> None:
        super().__init__()
        if jump <= 1.0 or base_minutes < 1 or length < 1 or min_days < 1:
            raise ValueError("need jump > 1, base_minutes >= 1, length >= 1, min_days >= 1")
        if not 0.0 <= share <= 1.0:
            raise ValueError("need 0 <= share <= 1")
        from predictor.registry import create

        self.inner_spec = inner
        self.inner = create(inner)
        self.jump = jump
        self.base_minutes = base_minutes
        self.length = length
        self.share = share
        self.min_days = min_days
        self.calendar = Calendar(
            np.zeros(MINUTES_PER_DAY), np.zeros(MINUTES_PER_DAY, bool), np.zeros(length), 0
        )

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
        return self.inner.forecast(history, steps)

    def rises(self, history: History, steps: int) -> RiseOutlook | None:
        if not self.fitted or history.observed.size == 0:
            return None
        return outlook(
            self.calendar,
            history,
            steps,
            jump=self.jump,
            base_minutes=self.base_minutes,
            share=self.share,
        )

    def get_state(self) -> dict[str, FloatArray]:
        inner = {f"inner.{k}": v for k, v in self.inner.get_state().items()}
        return {
            **inner,
            "calendar.chance": self.calendar.chance,
            "calendar.seen": self.calendar.seen.astype(np.float64),
            "calendar.shape": self.calendar.shape,
            "calendar.days": np.asarray(float(self.calendar.days)),
            "calendar.version": np.asarray(float(STATE_VERSION)),
        }

    def set_state(self, state: dict[str, FloatArray]) -> None:
        version = state.get("calendar.version")
        if version is None or int(version) != STATE_VERSION:
            raise ForecasterError(
                f"a calendar saved in state version {version}, this one reads "
                f"{STATE_VERSION} (its rises are now added to the base): refit"
            )
        self.inner.set_state(
            {k.removeprefix("inner."): v for k, v in state.items() if k.startswith("inner.")}
        )
        self.inner.fitted = True
        self.calendar = Calendar(
            np.asarray(state["calendar.chance"], dtype=np.float64),
            np.asarray(state["calendar.seen"]) > 0.5,
            np.asarray(state["calendar.shape"], dtype=np.float64),
            int(state["calendar.days"]),
        )
        if self.calendar.chance.shape != (MINUTES_PER_DAY,) or self.calendar.seen.shape != (
            MINUTES_PER_DAY,
        ):
            raise ForecasterError("a saved calendar must have one chance per minute of the day")
