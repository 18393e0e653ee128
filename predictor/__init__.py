"""Workload forecasting behind one interface.

`History` holds per-minute maximum 5 s rates; a `Forecaster` is fitted on one
and forecasts the next minutes' maxima. Built-in models are named in
`predictor.registry.BUILTIN` (imported lazily, so torch loads only for
"lstm"); a user's own model is named by "pkg.module:Class".
"""

from predictor.base import Forecaster, ForecasterError, History
from predictor.registry import create, load, resolve

__all__ = ["Forecaster", "ForecasterError", "History", "create", "load", "resolve"]
