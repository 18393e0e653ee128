"""Forecast sanity by hand: no step above the multiple of the observed peak or the max rate."""

from __future__ import annotations

import math

from provisioner.forecast_sanity import ForecastBounds, clip_forecast


def test_a_forecast_within_bounds_is_untouched() -> None:
    out, clip = clip_forecast([10.0, 20.0, 39.9], 20.0, ForecastBounds(multiple=2.0))
    assert out == [10.0, 20.0, 39.9] and clip is None


def test_a_runaway_forecast_is_clipped_to_the_multiple_of_the_observed_peak() -> None:
    out, clip = clip_forecast([33.1, 368.1, 43609.7, math.inf], 28.8, ForecastBounds(2.0))
    assert out == [33.1, 57.6, 57.6, 57.6]
    assert clip is not None and clip.steps_clipped == 3 and clip.ceiling == 57.6
    assert "2× the observed peak 28.8 r/s" in clip.why and "3 of 4" in clip.why


def test_the_models_max_rate_is_a_ceiling_too_and_nan_is_clipped() -> None:
    out, clip = clip_forecast([5.0, math.nan, 80.0], 100.0, ForecastBounds(2.0, 50.0))
    assert out == [5.0, 50.0, 50.0]
    assert clip is not None and "max_rate_rps 50" in clip.why


def test_no_bounds_configured_clips_only_nan() -> None:
    out, clip = clip_forecast([1e9, math.nan], 1.0, ForecastBounds(None, None))
    assert out == [1e9, 0.0] and clip is not None and clip.steps_clipped == 1
