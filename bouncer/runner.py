"""The model runner: loads a real torch model and runs batches on the device chosen for it.

A model is a TorchScript file, or ``package.module:factory`` returning a
``torch.nn.Module`` (the demo model is ``mark.demo:digits_model``). Where it
runs is a ``bouncer.device.DeviceChoice``: the CPU with one thread unless told
otherwise (the local world, the daemon's own profiling), CUDA (model and each
batch on the GPU), or a NeuronCore (the compiled Neuron artifact is loaded
instead of the source). Batches run under ``torch.inference_mode`` and come
back as numpy arrays on the host.
"""

from __future__ import annotations

import contextlib
import importlib
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bouncer.device import DeviceChoice
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


def load_neuron_artifact(artifact: str, package: str) -> torch.nn.Module:
    """A compiled Neuron model: TorchScript whose custom ops ``package`` registers on import."""
    try:
        importlib.import_module(package)
    except ImportError as exc:
        raise ModelLoadError(f"cannot import {package} for {artifact}: {exc}") from None
    if not Path(artifact).expanduser().is_file():
        raise ModelLoadError(f"Neuron artifact {artifact} is not a file")
    return load_model(artifact)


_interop_set = False  # torch allows setting the inter-op pool once per process, before use


def _set_threads(choice: DeviceChoice) -> None:
    global _interop_set
    torch.set_num_threads(choice.threads)
    if choice.interop_threads is not None and not _interop_set:
        _interop_set = True
        # Parallel work already started in this process: it keeps its pool.
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(choice.interop_threads)


class ModelRunner:
    """Runs batches of one model on the device ``choice`` names.

    Without a choice: the CPU with ``threads`` (one) torch thread, so agents
    sharing a machine share it fairly, as before devices were chosen. With an
    ``example`` (one instance, no batch dimension) the model is warmed up at load.
    """

    def __init__(
        self,
        source: str,
        threads: int = 1,
        *,
        choice: DeviceChoice | None = None,
        example: np.ndarray[Any, Any] | None = None,
    ) -> None:
        self.choice = choice if choice is not None else DeviceChoice.cpu(threads)
        _set_threads(self.choice)
        self.source = source
        self.device = torch.device(self.choice.device)
        self.cuda = self.device.type == "cuda"
        if self.choice.kind == "neuron" and self.choice.neuron_artifact:
            self.model = load_neuron_artifact(
                self.choice.neuron_artifact, self.choice.neuron_package or "torch_neuronx"
            )
        else:
            self.model = load_model(source).to(self.device)
        if example is not None:
            self.warm_up(example)

    def warm_up(self, example: np.ndarray[Any, Any], runs: int = 3) -> None:
        """Run a batch of one a few times: the first calls pay for lazy init, cuDNN, JIT."""
        batch = example[None, ...]
        for _ in range(runs if self.choice.kind != "cpu" else 1):
            self.run(batch)
        self.synchronize()

    def synchronize(self) -> None:
        """Wait for the device to finish what was queued (CUDA runs asynchronously)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def run(self, batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        if torch.get_num_threads() != self.choice.threads:
            # The count is per OS thread once a thread has run torch, and the agent runs
            # batches on a worker thread: one that predates this runner keeps its own.
            torch.set_num_threads(self.choice.threads)
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(batch))
            if self.cuda:
                x = x.to(self.device)
            out = self.model(x)
            if out.device.type != "cpu":
                out = out.cpu()  # a blocking copy: the batch has finished on the device
        result: np.ndarray[Any, Any] = out.numpy()
        return result

    def timed(self, batch: np.ndarray[Any, Any]) -> float:
        """Seconds one batch takes end to end, the device synchronized on both sides."""
        self.synchronize()
        t0 = time.perf_counter()
        self.run(batch)
        self.synchronize()
        return time.perf_counter() - t0

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
            times = [self.timed(batch) for _ in range(runs)]
            floor = max(floor, float(np.quantile(times, 0.25)))
            table[b] = floor
        return BatchLatency.from_mapping(table)
