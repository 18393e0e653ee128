"""The model runner: a model's contract loaded on its device, run on batches of named tensors.

What a model takes and gives is its ``ModelContract``; how it runs is its
format's runtime (``bouncer.runtimes``: TorchScript or a torch factory, ONNX,
a Python handler). Where it runs is a ``bouncer.device.DeviceChoice``: the CPU
with one thread unless told otherwise (the local world, the daemon's own
profiling), CUDA, or a NeuronCore. Every batch's outputs are checked against
the contract and cast to its types, so every hop hands back the same numbers.
This module imports neither torch nor onnxruntime: only the runtime loaded does.
"""

from __future__ import annotations

import time

import numpy as np

from bouncer.contract import ContractError, Inputs, ModelContract, check_outputs
from bouncer.device import DeviceChoice
from bouncer.latency import BatchLatency
from bouncer.runtimes import ModelLoadError, Runtime, load_runtime

__all__ = ["ModelLoadError", "ModelRunner", "batch_size"]


def batch_size(contract: ModelContract, inputs: Inputs) -> int:
    """The batch of ``inputs``: every declared input present, all with one first dimension."""
    sizes: set[int] = set()
    for t in contract.inputs:
        if t.name not in inputs:
            got = ", ".join(map(repr, inputs)) or "none"
            raise ContractError(f"model {contract.name!r} needs input {t.name!r} (got {got})")
        arr = inputs[t.name]
        if arr.ndim == 0:
            raise ContractError(f"model {contract.name!r} input {t.name!r} has no batch dimension")
        sizes.add(int(arr.shape[0]))
    if len(sizes) != 1:
        raise ContractError(
            f"model {contract.name!r} inputs disagree on the batch size: {sorted(sizes)}"
        )
    return sizes.pop()


class ModelRunner:
    """Runs batches of one model on the device ``choice`` names.

    Without a choice: the CPU with ``threads`` (one) intra-op thread, so agents
    sharing a machine share it fairly. ``warm=True`` warms the model up at load.
    """

    def __init__(
        self,
        contract: ModelContract,
        threads: int = 1,
        *,
        choice: DeviceChoice | None = None,
        warm: bool = False,
    ) -> None:
        self.contract = contract
        self.choice = choice if choice is not None else DeviceChoice.cpu(threads)
        self.runtime: Runtime = load_runtime(contract, self.choice)
        if warm:
            self.warm_up()

    def warm_up(self, runs: int = 3) -> None:
        """Run a batch of one a few times: the first calls pay for lazy init, cuDNN, JIT."""
        example = self.contract.example(1)
        for _ in range(runs if self.choice.kind != "cpu" else 1):
            self.run(example)
        self.synchronize()

    def synchronize(self) -> None:
        """Wait for the device to finish what was queued (CUDA runs asynchronously)."""
        self.runtime.synchronize()

    def run(self, inputs: Inputs) -> Inputs:
        """The outputs by name, checked against the contract and cast to its types."""
        batch = batch_size(self.contract, inputs)
        return check_outputs(self.contract, self.runtime.run(inputs), batch)

    def timed(self, inputs: Inputs) -> float:
        """Seconds one batch takes end to end, the device synchronized on both sides."""
        self.synchronize()
        t0 = time.perf_counter()
        self.run(inputs)
        self.synchronize()
        return time.perf_counter() - t0

    def profile(self, sizes: tuple[int, ...] = (1, 2, 4, 8, 16), runs: int = 7) -> BatchLatency:
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
            inputs = self.contract.example(b)
            self.run(inputs)  # warm-up
            times = [self.timed(inputs) for _ in range(runs)]
            floor = max(floor, float(np.quantile(times, 0.25)))
            table[b] = floor
        return BatchLatency.from_mapping(table)
