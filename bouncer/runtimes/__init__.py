"""Runtimes: one per model format, each running a batch of named inputs to named outputs.

``load_runtime`` reads a ``ModelContract`` and a ``DeviceChoice`` and returns a
``Runtime`` whose ``run`` takes the contract's inputs by name (batch first) and
gives the model's raw outputs by name; ``bouncer.runner.ModelRunner`` checks and
casts them against the contract. Each format's module is imported only when a
model of that format is loaded, so a process serving an ONNX model never
imports torch (a Lambda cold start pays for what it runs, nothing else).

Every failure to load raises ``ModelLoadError``, naming the model, what is
wrong, which field of the contract to change and how.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from bouncer.contract import ContractError, ModelContract
from bouncer.device import DeviceChoice

__all__ = ["ModelLoadError", "Runtime", "artifact_file", "load_runtime", "name_outputs"]


class ModelLoadError(Exception):
    """The model cannot be loaded: ``field`` of its contract is wrong, ``fix`` says how.

    ``problem`` never repeats the field: the message reads "model 'm': field: problem; fix".
    """

    def __init__(self, model: str, problem: str, fix: str, field: str = "artifact") -> None:
        self.model, self.problem, self.fix, self.field = model, problem, fix, field
        super().__init__(f"model {model!r}: {field}: {problem}; {fix}")


class Runtime(Protocol):
    """A loaded model on its device."""

    def run(self, inputs: Mapping[str, Any]) -> Mapping[str, Any]:
        """The raw outputs by name, batch first (arrays, or what converts to them)."""
        ...

    def synchronize(self) -> None:
        """Wait for work queued on the device (CUDA runs asynchronously); else nothing."""
        ...


def load_runtime(contract: ModelContract, choice: DeviceChoice) -> Runtime:
    """The model ``contract`` describes, loaded on ``choice``'s device."""
    if contract.format in ("torchscript", "pytorch"):
        from bouncer.runtimes.torch_runtime import load_torch

        return load_torch(contract, choice)
    if contract.format == "onnx":
        from bouncer.runtimes.onnx_runtime import load_onnx

        return load_onnx(contract, choice)
    if contract.format == "python":
        from bouncer.runtimes.python_runtime import load_python

        return load_python(contract)
    raise ModelLoadError(
        contract.name,
        f"unknown format {contract.format!r}",
        "set format to torchscript, onnx, python or pytorch",
        field="format",
    )


def artifact_file(contract: ModelContract, what: str) -> Path:
    """The contract's artifact as an existing file, or a ``ModelLoadError`` saying so."""
    path = Path(contract.artifact).expanduser()
    if not path.exists():
        raise ModelLoadError(
            contract.name,
            f"{path} does not exist",
            f"put the {what} there or set artifact to where it is",
        )
    if not path.is_file():
        raise ModelLoadError(contract.name, f"{path} is not a file", f"set artifact to the {what}")
    return path


def name_outputs(contract: ModelContract, result: Any, what: str) -> Mapping[str, Any]:
    """A model's return value by output name: a mapping as it is, a tuple or list in the
    declared order, anything else as the one declared output."""
    names = [t.name for t in contract.outputs]
    if isinstance(result, Mapping):
        return result
    if isinstance(result, tuple | list):
        if len(result) != len(names):
            raise ContractError(
                f"model {contract.name!r} returned {len(result)} {what}s, the manifest "
                f"declares {len(names)} outputs ({', '.join(map(repr, names))})"
            )
        return dict(zip(names, result, strict=True))
    if len(names) != 1:
        raise ContractError(
            f"model {contract.name!r} returned one {what}, the manifest declares "
            f"{len(names)} outputs ({', '.join(map(repr, names))}): return a tuple in "
            "that order or a dict by name"
        )
    return {names[0]: result}
