"""Forecasters by name or by import path.

Built-in names map to import paths and are imported only when asked for, so
choosing "last" does not pay for importing torch. Anything else of the form
"pkg.module:Class" is a user's own `Forecaster` subclass.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
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


def code_digest(spec: str) -> str:
    """A digest of the code that fits ``spec``: this package's sources and those of every
    class in the model's lineage. A cache of fitted models keyed by it is refitted after
    any change to that code, which its parameters alone would not show (the training
    loop, a feature, the numerics)."""
    files = set(Path(__file__).parent.glob("*.py"))
    for cls in inspect.getmro(resolve(spec)):
        with contextlib.suppress(TypeError, OSError):  # a built-in has no source file
            source = inspect.getsourcefile(cls)
            if source is not None:
                files.add(Path(source))
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


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
