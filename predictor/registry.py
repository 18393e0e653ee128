"""Forecasters by name or by import path.

Built-in names map to import paths and are imported only when asked for, so
choosing "last" does not pay for importing torch. Anything else of the form
"pkg.module:Class" is a user's own `Forecaster` subclass.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from predictor.base import FORMAT_VERSION, Forecaster, ForecasterError

BUILTIN: dict[str, str] = {
    "last": "predictor.baselines:LastValue",
    "seasonal": "predictor.baselines:SeasonalNaive",
    "seasonal-week": "predictor.baselines:SeasonalNaiveWeek",
    "paper": "predictor.baselines:PaperFallback",
    "ets": "predictor.statistical:HoltWinters",
    "sarima": "predictor.statistical:SeasonalArima",
    "lstm": "predictor.lstm:LSTMForecaster",
    "lstm-calendar": "predictor.rise_calendar:RiseCalendarForecaster",
}

# Models that are not learned: the bar a learned model has to clear.
NAIVE = ("last", "seasonal", "seasonal-week", "paper")


def resolve(spec: str) -> type[Forecaster]:
    """The class for a built-in name or a "pkg.module:Class" path."""
    target = BUILTIN.get(spec, spec)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        known = ", ".join(BUILTIN)
        raise ForecasterError(f"unknown model {spec!r}: use one of {known} or 'pkg.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ForecasterError(f"cannot import {module_name!r} for model {spec!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ForecasterError(f"{module_name!r} has no attribute {attr!r}")
    if not (isinstance(obj, type) and issubclass(obj, Forecaster)):
        raise ForecasterError(f"{target!r} is not a predictor.base.Forecaster subclass")
    return obj


def create(spec: str, **params: Any) -> Forecaster:
    """A new, unfitted forecaster."""
    cls = resolve(spec)
    try:
        return cls(**params)
    except TypeError as exc:
        raise ForecasterError(f"bad parameters for model {spec!r}: {exc}") from exc


def load(path: str | Path) -> Forecaster:
    """A fitted forecaster from a file written by `Forecaster.save`."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["__meta__"]))
            state = {key: np.asarray(data[key]) for key in data.files if key != "__meta__"}
    except (OSError, ValueError, KeyError) as exc:
        raise ForecasterError(f"{path} is not a saved forecaster: {exc}") from exc
    if meta.get("format") != FORMAT_VERSION:
        raise ForecasterError(f"{path} has format {meta.get('format')!r}, need {FORMAT_VERSION}")
    cls = resolve(str(meta["class"]))
    return cls.from_saved(dict(meta["params"]), state)
