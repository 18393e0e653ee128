"""Workloads for the simulator: per-second load, then seeded request arrival times.

A workload is the expected number of requests in every second of a long
series (the trace, days of it) plus where in it the simulated window starts.
Everything before the window is history: the predictor is trained on it and
the store is pre-loaded with it, so the controller starts the way a daemon
that has been running for days would. Nothing after the window's start is
shown to anything but the request generator (and the clairvoyant optimum).

Archive gaps in the Twitter trace (zero runs longer than a minute, "missing
data, not a drop in traffic") are filled by linear interpolation, so a
simulated fleet is not retired for half an hour every night because a file
was missing.

Traces are read by `predictor.traces`: ``twitter`` and ``nab`` are the traces
shipped in the package (`predictor/data/traces/`), anything else is a path.
Second 0 of a trace's workload is its first row, whatever its time (an offset,
or Unix seconds), and ``epoch`` is that row's time, so ``start_day`` counts days
from the first row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from mark.errors import ConfigError
from predictor.base import fill_gaps
from predictor.mmpp import MMPP_START, Mmpp
from predictor.traces import (
    SHIPPED_TRACES,
    TWITTER_START,
    TraceError,
    load_nab,
    read_per_second,
    shipped_trace,
    trace_format,
)

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Workload:
    """Expected requests per second; second 0 is at Unix time ``epoch``."""

    name: str
    per_second: FloatArray
    epoch: float
    start: int  # first simulated second (index into per_second)
    seconds: int  # simulated seconds

    @property
    def end(self) -> int:
        return self.start + self.seconds

    @property
    def t0(self) -> float:
        """Unix time the simulated window starts."""
        return self.epoch + self.start

    def minute_max_rates(self, begin: int, end: int, window_s: int = 5) -> FloatArray:
        """The paper's per-minute series (max P_s-window rate) for seconds [begin, end)."""
        begin -= begin % 60
        n_min = (end - begin) // 60
        x = self.per_second[begin : begin + n_min * 60]
        w = x.reshape(n_min, 60 // window_s, window_s).sum(axis=2) / window_s
        return np.asarray(w.max(axis=1), dtype=np.float64)

    def arrivals(self, begin: int, end: int, seed: int) -> FloatArray:
        """Sorted Unix arrival times in seconds [begin, end): Poisson counts around the
        expected load, spread uniformly within each second (seeded, reproducible)."""
        rng = np.random.default_rng(seed)
        lam = self.per_second[begin:end]
        counts = rng.poisson(lam)
        total = int(counts.sum())
        base = np.repeat(np.arange(begin, end, dtype=np.float64), counts)
        times = base + rng.random(total)
        # Within a second the offsets are unsorted; sorting per second is a global sort.
        times.sort()
        return np.asarray(times + self.epoch, dtype=np.float64)


def _scaled(x: FloatArray, rate_scale: float, time_scale: float) -> FloatArray:
    """Rates × rate_scale; time_scale > 1 plays the trace faster (k trace seconds per
    simulated second, averaged), < 1 slower (each trace second stretched)."""
    if rate_scale <= 0 or time_scale <= 0:
        raise ConfigError("rate and time scales must be positive")
    if time_scale != 1.0:
        n_out = int(x.shape[0] / time_scale)
        edges = np.arange(n_out + 1) * time_scale
        cum = np.concatenate([[0.0], np.cumsum(x)])
        at = np.interp(edges, np.arange(cum.shape[0]), cum)
        x = np.diff(at) / time_scale  # mean rate of the trace over each simulated second
    return np.asarray(x * rate_scale, dtype=np.float64)


def trace_path(name: str) -> Path:
    """A shipped trace's name (inside the installed package), or a path."""
    if name in SHIPPED_TRACES:
        path = shipped_trace(name)
        if not path.is_file():
            raise ConfigError(
                f"the shipped trace {name!r} is missing from the install ({path}); "
                "reinstall mark, or give a file path instead"
            )
        return path
    path = Path(name)
    if not path.exists():
        raise ConfigError(
            f"no trace {name!r}: give twitter, nab, mmpp, surge or a CSV path "
            "(second,requests per second, or NAB timestamp,value per 5 minutes)"
        )
    return path


def load_per_second_load(path: Path) -> tuple[FloatArray, float]:
    """A trace file as expected requests per second from its first row, gaps filled;
    and the Unix time of that row."""
    try:
        if trace_format(path) == "nab":
            hist = load_nab(path)  # per-minute rates (5-minute buckets spread evenly)
            epoch = float(hist.start.astype("datetime64[s]").astype(np.int64))
            return np.repeat(fill_gaps(hist.values), 60).astype(np.float64), epoch
        trace = read_per_second(path)
    except TraceError as exc:
        raise ConfigError(str(exc)) from exc
    return fill_gaps(np.where(trace.missing, np.nan, trace.counts)), trace.epoch


def trace_workload(
    name: str,
    *,
    hours: float,
    start_day: float,
    rate_scale: float = 1.0,
    time_scale: float = 1.0,
    mean_rps: float | None = None,
) -> Workload:
    """``hours`` of a trace starting ``start_day`` days in; everything before is history."""
    per_second, epoch = load_per_second_load(trace_path(name))
    x = _scaled(per_second, rate_scale, time_scale)
    start = round(start_day * 86400)  # a start hour as a fraction of a day lands on its second
    seconds = int(hours * 3600)
    if start + seconds > x.shape[0] or start < 0:
        raise ConfigError(
            f"trace {name!r} holds {x.shape[0] / 86400:.1f} days after scaling; "
            f"cannot simulate {hours:g} h from day {start_day:g}"
        )
    if mean_rps is not None:
        mean = float(x[start : start + seconds].mean())
        x = x * (mean_rps / mean) if mean > 0 else x
    return Workload(
        Path(name).stem if name not in SHIPPED_TRACES else name, x, epoch, start, seconds
    )


def mmpp_workload(
    *, hours: float, history_days: float = 2.0, rate_scale: float = 1.0, seed: int = 0
) -> Workload:
    """Bursty Markov-modulated load (predictor.mmpp); history is more of the same chain."""
    seconds = int(hours * 3600)
    start = int(history_days * 86400)
    rng = np.random.default_rng(seed)
    m = Mmpp()
    states = m.state_path(start + seconds, rng)
    rates = np.asarray(m.rates, dtype=np.float64)[states] * rate_scale
    epoch = float(MMPP_START.astype("datetime64[s]").astype(np.int64))
    return Workload("mmpp", rates, epoch, start, seconds)


def surge_workload(
    *,
    base_rps: float,
    surge: float,
    hours: float = 1.0,
    surge_at_s: float = 1800.0,
    ramp_s: float = 120.0,
    hold_s: float = 600.0,
    history_days: float = 1.0,
) -> Workload:
    """The paper's surge microbenchmark (§5.3, Fig. 9a–c): a steady load that rises by
    ``surge`` (0.5 = +50 %) within ``ramp_s`` seconds, holds, and falls back."""
    if surge <= -1:
        raise ConfigError("a surge below -100 % is not a load")
    seconds = int(hours * 3600)
    start = int(history_days * 86400)
    x = np.full(start + seconds, float(base_rps))
    t = np.arange(seconds, dtype=np.float64)
    up = np.clip((t - surge_at_s) / ramp_s, 0.0, 1.0)
    down = np.clip((t - surge_at_s - ramp_s - hold_s) / ramp_s, 0.0, 1.0)
    x[start:] = base_rps * (1.0 + surge * (up - down))
    epoch = float(TWITTER_START.astype("datetime64[s]").astype(np.int64))
    return Workload(f"surge+{surge:.0%}", x, epoch, start, seconds)
