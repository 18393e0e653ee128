"""Forecast sanity: no plan buys for a load far above anything the history supports.

A forecaster is a learned model and can be wrong without bound (an LSTM fitted
on the wrong history once forecast 25 r/s as 43,609 r/s four minutes later).
The planner trusts the forecast, so the control step clips it first: no step
may exceed ``multiple`` × the highest rate observed in the history the
forecaster was given, nor the model's configured maximum rate. A clip is
reported so that the step records it as a decision with its reason.

Pure: plain numbers in, the clipped forecast and the reason out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ForecastBounds:
    multiple: float | None = 2.0
    """Of the observed peak; None: no clip by history."""
    max_rate_rps: float | None = None
    """The model's configured maximum rate; None: none configured."""


@dataclass(frozen=True)
class Clip:
    raw_peak: float
    ceiling: float
    steps_clipped: int
    why: str


def ceiling(observed_peak: float, bounds: ForecastBounds) -> float:
    """The highest rate a forecast step may ask for (inf: no bound applies)."""
    top = math.inf
    if bounds.multiple is not None:
        top = min(top, bounds.multiple * max(observed_peak, 0.0))
    if bounds.max_rate_rps is not None:
        top = min(top, bounds.max_rate_rps)
    return top


def clip_forecast(
    forecast: Sequence[float], observed_peak: float, bounds: ForecastBounds
) -> tuple[list[float], Clip | None]:
    """The forecast with every step above the ceiling lowered to it, and the clip if any.

    A non-finite step is clipped too (the planner cannot buy for infinity).
    """
    top = ceiling(observed_peak, bounds)
    out: list[float] = []
    clipped = 0
    raw_peak = 0.0
    for x in forecast:
        v = float(x)
        raw_peak = max(raw_peak, v) if not math.isnan(v) else raw_peak
        if math.isnan(v) or v > top:
            clipped += 1
            v = top if math.isfinite(top) else 0.0
        out.append(v)
    if clipped == 0:
        return out, None
    reasons = []
    if bounds.multiple is not None and top == bounds.multiple * max(observed_peak, 0.0):
        reasons.append(f"{bounds.multiple:g}× the observed peak {observed_peak:.1f} r/s")
    if bounds.max_rate_rps is not None and top == bounds.max_rate_rps:
        reasons.append(f"the model's max_rate_rps {bounds.max_rate_rps:g}")
    why = (
        f"forecast peak {raw_peak:.1f} r/s is above {' and '.join(reasons) or 'its bound'}: "
        f"{clipped} of {len(out)} step(s) clipped to {top:.1f} r/s"
    )
    return out, Clip(raw_peak, top, clipped, why)
