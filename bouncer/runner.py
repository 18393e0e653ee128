"""The model runner: loads a real torch model and runs batches on the CPU.

A model is a TorchScript file, or ``package.module:factory`` returning a
``torch.nn.Module`` (the demo model is ``mark.demo:digits_model``).
"""

from __future__ import annotations

import importlib
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bouncer.latency import BatchLatency


class ModelLoadError(Exception):
    """The model source cannot be loaded; the message says why."""


def load_model(source: str) -> torch.nn.Module:
    path = Path(source).expanduser()
    if path.is_file():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                module: torch.nn.Module = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
            except (RuntimeError, ValueError) as exc:
                raise ModelLoadError(f"{source} is not a TorchScript file: {exc}") from None
        return module.eval()
    mod_name, sep, attr = source.partition(":")
    if not sep:
        raise ModelLoadError(f"{source!r} is neither a file nor 'package.module:factory'")
    try:
        factory = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ModelLoadError(f"cannot import {source!r}: {exc}") from None
    try:
        model = factory()
    except Exception as exc:  # a user's factory can fail in any way; say which and how
        raise ModelLoadError(f"factory {source!r} failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(f"{source!r} returned {type(model).__name__}, not a torch module")
    return model.eval()


class ModelRunner:
    """Runs batches of one model; single-threaded torch so agents share a machine fairly."""

    def __init__(self, source: str, threads: int = 1) -> None:
        torch.set_num_threads(threads)
        self.source = source
        self.model = load_model(source)

    def run(self, batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        with torch.inference_mode():
            out = self.model(torch.from_numpy(np.ascontiguousarray(batch)))
        result: np.ndarray[Any, Any] = out.numpy()
        return result

    def profile(
        self,
        example: np.ndarray[Any, Any],
        sizes: tuple[int, ...] = (1, 2, 4, 8, 16),
        runs: int = 7,
    ) -> BatchLatency:
        """Measure T_b on this machine: warm up, then the lower quartile of ``runs`` per size.

        Other processes on the machine only ever add time, so a low quantile is
        the model's own cost and two processes profiling the same model agree
        (the daemon plans with one profile, each agent admits with its own); a
        median takes in whatever else ran meanwhile. T_b is made non-decreasing
        in b: a larger batch measured faster is noise, not speed.
        """
        table: dict[int, float] = {}
        floor = 0.0
        for b in sorted(sizes):
            batch = np.repeat(example[None, ...], b, axis=0)
            self.run(batch)  # warm-up
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                self.run(batch)
                times.append(time.perf_counter() - t0)
            floor = max(floor, float(np.quantile(times, 0.25)))
            table[b] = floor
        return BatchLatency.from_mapping(table)
