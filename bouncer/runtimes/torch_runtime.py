"""torch models: a TorchScript file, or ``package.module:factory`` returning a module.

Inputs go to ``forward`` positionally in the contract's order (on the GPU for
CUDA); a returned tensor is the one declared output, a tuple or list the
outputs in declared order, a dict the outputs by name. On a NeuronCore the
compiled Neuron artifact is loaded instead (TorchScript whose ops the Neuron
package registers on import). Batches run under ``torch.inference_mode`` and
come back as numpy arrays on the host.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bouncer.contract import ModelContract
from bouncer.device import DeviceChoice
from bouncer.runtimes import ModelLoadError, artifact_file, name_outputs

EXPORT = (
    "export it with torch.jit.script/torch.jit.trace and torch.jit.save, "
    "or to ONNX with torch.onnx.export"
)

_interop_set = False  # torch allows setting the inter-op pool once per process, before use


def _set_threads(choice: DeviceChoice) -> None:
    global _interop_set
    torch.set_num_threads(choice.threads)
    if choice.interop_threads is not None and not _interop_set:
        _interop_set = True
        # Parallel work already started in this process: it keeps its pool.
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(choice.interop_threads)


def _is_state_dict(path: Path) -> bool:
    """Whether ``path`` is ``torch.save(model.state_dict())``: tensors by name, no model."""
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception:  # unreadable as tensors by name (a text file, a pickled module)
        return False
    return (
        isinstance(obj, Mapping)
        and bool(obj)
        and all(isinstance(v, torch.Tensor) for v in obj.values())
    )


def load_torchscript(name: str, path: Path) -> torch.nn.Module:
    """A TorchScript file on the CPU, or a ``ModelLoadError`` that says what the file is."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            module: torch.nn.Module = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
        except (RuntimeError, ValueError) as exc:
            if _is_state_dict(path):
                raise ModelLoadError(
                    name, f"{path} is a state_dict (weights only), not a model", EXPORT
                ) from None
            if path.suffix == ".onnx" or not zipfile.is_zipfile(path):
                fix = f"if it is an ONNX model set format to onnx; else {EXPORT}"
            else:
                fix = EXPORT
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelLoadError(
                name, f"{path} is not a TorchScript file ({reason})", fix
            ) from None
    return module.eval()


def _from_factory(contract: ModelContract) -> torch.nn.Module:
    source = contract.artifact
    mod_name, sep, attr = source.partition(":")
    if not sep or not mod_name or not attr:
        raise ModelLoadError(
            contract.name,
            f"{source!r} is not 'package.module:factory'",
            "name the factory as package.module:factory, or for a TorchScript file "
            "set format to torchscript",
        )
    try:
        module = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ModelLoadError(
            contract.name,
            f"cannot import module {mod_name!r} of {source!r}: {exc}",
            "install the package that provides it or correct the module's name",
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelLoadError(
            contract.name,
            f"module {mod_name!r} has no factory {attr!r}",
            f"define {attr}() returning a torch.nn.Module in {mod_name}, or correct the name",
        )
    try:
        model = factory()
    except Exception as exc:  # a user's factory can fail in any way; say which and how
        raise ModelLoadError(
            contract.name,
            f"factory {source!r} failed: {type(exc).__name__}: {exc}",
            "make the factory build the model without arguments",
        ) from None
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(
            contract.name,
            f"factory {source!r} returned {type(model).__name__}, not a torch.nn.Module",
            "return the model itself (a torch.nn.Module) from the factory",
        )
    return model.eval()


def _from_neuron(contract: ModelContract, artifact: str, package: str) -> torch.nn.Module:
    """A compiled Neuron model: TorchScript whose custom ops ``package`` registers on import."""
    try:
        importlib.import_module(package)
    except ImportError as exc:
        raise ModelLoadError(
            contract.name,
            f"cannot import {package} for {artifact}: {exc}",
            f"install {package} (the Neuron SDK) or serve without the Neuron artifact",
            field="neuron_artifact",
        ) from None
    path = Path(artifact).expanduser()
    if not path.is_file():
        raise ModelLoadError(
            contract.name,
            f"Neuron artifact {artifact} is not a file",
            "compile the model with torch_neuronx.trace and save it there",
            field="neuron_artifact",
        )
    return load_torchscript(contract.name, path)


class TorchRuntime:
    """A torch module on ``choice``'s device, run on the contract's inputs in order."""

    def __init__(self, contract: ModelContract, choice: DeviceChoice, module: torch.nn.Module):
        self.contract = contract
        self.choice = choice
        self.device = torch.device(choice.device)
        self.cuda = self.device.type == "cuda"
        self.module = module.to(self.device)
        self._order = [t.name for t in contract.inputs]

    def _tensor(self, a: Any) -> torch.Tensor:
        arr = np.ascontiguousarray(a)
        if not arr.flags.writeable:  # torch warns on read-only memory (a request's buffer)
            arr = arr.copy()
        x = torch.from_numpy(arr)
        return x.to(self.device) if self.cuda else x

    def run(self, inputs: Mapping[str, Any]) -> Mapping[str, Any]:
        if torch.get_num_threads() != self.choice.threads:
            # The count is per OS thread once a thread has run torch, and the agent runs
            # batches on a worker thread: one that predates this runtime keeps its own.
            torch.set_num_threads(self.choice.threads)
        with torch.inference_mode():
            result = self.module(*(self._tensor(inputs[n]) for n in self._order))
            named = name_outputs(self.contract, result, "tensor")
            # .cpu() is a blocking copy: the batch has finished on the device.
            return {k: _host(v) for k, v in named.items()}

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


def _host(v: Any) -> Any:
    return v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v


def load_torch(contract: ModelContract, choice: DeviceChoice) -> TorchRuntime:
    """The contract's torch model (or its Neuron artifact on a NeuronCore) on ``choice``."""
    _set_threads(choice)
    if choice.kind == "neuron" and choice.neuron_artifact:
        package = choice.neuron_package or "torch_neuronx"
        module = _from_neuron(contract, choice.neuron_artifact, package)
    elif contract.format == "torchscript":
        module = load_torchscript(contract.name, artifact_file(contract, "TorchScript file"))
    else:
        module = _from_factory(contract)
    return TorchRuntime(contract, choice, module)
