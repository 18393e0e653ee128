"""The demo: the digits model, the open-loop load generator and the ramp demo (`mark demo`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mark.demo.model import (
        DEMO_SOURCE,
        DigitsCNN,
        default_model_path,
        digits_model,
        ensure_demo_model,
        load_digits_tensors,
        load_torchscript,
        save_torchscript,
        train_digits,
    )

# The model's names as they were when this package was the module mark/demo.py; the
# default source "mark.demo:digits_model" names this package. Loaded on first use, so
# the load generator and the ramp demo's CLI do not import torch.
__all__ = [
    "DEMO_SOURCE",
    "DigitsCNN",
    "default_model_path",
    "digits_model",
    "ensure_demo_model",
    "load_digits_tensors",
    "load_torchscript",
    "save_torchscript",
    "train_digits",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("mark.demo.model"), name)
    globals()[name] = value
    return value
