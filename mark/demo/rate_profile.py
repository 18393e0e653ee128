"""The rate a load run follows, and the Poisson arrival times drawn from it.

A rate profile is piecewise linear (``"0:5,60:40,180:40,240:5"``,
seconds:requests/s) or a trace file's per-minute peaks replayed faster than
real time. Arrivals are a non-homogeneous Poisson process (thinning of a
homogeneous one at the profile's peak), so the 5 s rate windows the daemon
samples are as bursty as real independent clients.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from mark.errors import MarkError

FloatArray = NDArray[np.float64]


class LoadgenError(MarkError):
    """Bad input to the load generator (a profile, a trace, a model the server lacks)."""


@dataclass(frozen=True)
class RateProfile:
    """Requests per second over time: straight lines between (seconds, rate) points.

    The first point is at 0 s, times strictly increase, and the run lasts
    until the last point.
    """

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if len(self.points) < 2:
            raise LoadgenError(
                f"a rate profile needs at least two points (e.g. 0:5,60:40), got {len(self.points)}"
            )
        times = [t for t, _ in self.points]
        if times[0] != 0:
            raise LoadgenError(f"a rate profile must start at 0 s, not {times[0]:g} s")
        for a, b in itertools.pairwise(times):
            if b <= a:
                raise LoadgenError(f"profile times must increase: {b:g} s comes after {a:g} s")
        for t, r in self.points:
            if not (math.isfinite(t) and math.isfinite(r)) or r < 0:
                raise LoadgenError(f"rate at {t:g} s is {r:g}; rates must be finite and >= 0")
        if self.peak <= 0:
            raise LoadgenError("every rate in the profile is 0: nothing would be sent")

    @classmethod
    def parse(cls, text: str) -> RateProfile:
        """``"0:5,60:40,180:40,240:5"``: comma-separated seconds:requests-per-second."""
        points = []
        for item in text.split(","):
            t, sep, r = item.strip().partition(":")
            if not sep:
                raise LoadgenError(
                    f"profile point {item.strip()!r} is not SECONDS:RATE (e.g. 0:5,60:40,240:5)"
                )
            try:
                points.append((float(t), float(r)))
            except ValueError:
                raise LoadgenError(
                    f"profile point {item.strip()!r}: seconds and rate must be numbers"
                ) from None
        return cls(tuple(points))

    @classmethod
    def from_options(
        cls, profile: str | None, trace: Path | None, speedup: float, scale: float, default: str
    ) -> RateProfile:
        """The CLI's choice: ``--profile`` text or a ``--trace`` file, never both."""
        if trace is not None and profile is not None:
            raise LoadgenError("give --profile or --trace, not both")
        if trace is not None:
            return cls.from_trace(trace, speedup=speedup, scale=scale)
        return cls.parse(profile or default)

    @classmethod
    def from_trace(
        cls,
        path: str | Path,
        *,
        speedup: float = 60.0,
        scale: float = 1.0,
        start_minute: int = 0,
        minutes: int | None = None,
    ) -> RateProfile:
        """A trace's per-minute maximum rates, replayed ``speedup`` times faster.

        With the default 60 a trace minute lasts one second. Missing minutes
        (trace gaps) are interpolated, as the predictor does. ``scale``
        multiplies every rate, so a busy trace fits one machine. ``path`` is a
        file or a shipped trace's name (``twitter``, ``nab``); ``start_minute``
        counts from the trace's first row, whatever its time (see
        `predictor.traces`).
        """
        from predictor.base import fill_gaps
        from predictor.traces import load_trace

        if speedup <= 0 or scale <= 0:
            raise LoadgenError(f"speedup and scale must be > 0, got {speedup:g} and {scale:g}")
        try:
            history = load_trace(path)
        except Exception as exc:  # the trace loader's errors are one-line already
            raise LoadgenError(str(exc)) from None
        values = fill_gaps(history.values)[start_minute:]
        if minutes is not None:
            values = values[:minutes]
        if values.size < 2:
            raise LoadgenError(
                f"{path}: fewer than 2 minutes left from minute {start_minute}; "
                "choose an earlier start or more minutes"
            )
        step = 60.0 / speedup
        return cls(tuple((k * step, float(v) * scale) for k, v in enumerate(values)))

    @property
    def duration(self) -> float:
        return self.points[-1][0]

    @property
    def peak(self) -> float:
        return max(r for _, r in self.points)

    def rate(self, t: float | FloatArray) -> FloatArray:
        """The profile's rate at time(s) ``t``; 0 outside [0, duration]."""
        times = np.array([p[0] for p in self.points])
        rates = np.array([p[1] for p in self.points])
        out = np.interp(np.asarray(t, dtype=np.float64), times, rates, left=0.0, right=0.0)
        return np.asarray(out, dtype=np.float64)

    def expected_requests(self) -> float:
        """The integral of the rate: how many requests a run sends on average."""
        total = 0.0
        for (t0, r0), (t1, r1) in itertools.pairwise(self.points):
            total += (t1 - t0) * (r0 + r1) / 2.0
        return total

    def __str__(self) -> str:
        return ",".join(f"{t:g}:{r:g}" for t, r in self.points)


def arrival_times(profile: RateProfile, rng: np.random.Generator) -> FloatArray:
    """Arrival offsets (s, sorted) of a Poisson process whose rate follows ``profile``.

    Thinning (Lewis & Shedler): draw a homogeneous process at the peak rate
    and keep each point with probability rate(t) / peak. Exact, and vectorised.
    """
    peak, span = profile.peak, profile.duration
    n = int(rng.poisson(peak * span))
    candidates = np.sort(rng.uniform(0.0, span, n))
    keep = rng.uniform(0.0, peak, n) < profile.rate(candidates)
    return np.asarray(candidates[keep], dtype=np.float64)
