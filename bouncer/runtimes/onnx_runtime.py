"""ONNX models, run by onnxruntime on the providers ``bouncer.device.onnx_providers`` picks.

Inputs are fed by name and the contract's outputs fetched by name, so the
contract's names must be the graph's: checked at load, where a mismatch is a
one-line fix, rather than on the first request. The contract may declare a
subset of the graph's outputs (onnxruntime computes only what is fetched).
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnxruntime as ort

from bouncer.contract import ModelContract
from bouncer.device import DeviceChoice, onnx_providers
from bouncer.runtimes import ModelLoadError, artifact_file


def _names(names: list[str] | set[str]) -> str:
    return ", ".join(repr(n) for n in sorted(names)) or "none"


def _check_names(contract: ModelContract, session: Any) -> None:
    graph_in = {i.name for i in session.get_inputs()}
    graph_out = {o.name for o in session.get_outputs()}
    declared_in = {t.name for t in contract.inputs}
    if declared_in != graph_in:
        raise ModelLoadError(
            contract.name,
            f"the manifest's inputs ({_names(declared_in)}) are not the ONNX graph's "
            f"({_names(graph_in)})",
            "name the manifest's inputs as the graph does",
            field="inputs",
        )
    unknown = {t.name for t in contract.outputs} - graph_out
    if unknown:
        raise ModelLoadError(
            contract.name,
            f"the manifest's outputs {_names(unknown)} are not in the ONNX graph, whose "
            f"outputs are {_names(graph_out)}",
            "name the manifest's outputs as the graph does",
            field="outputs",
        )


def _session(contract: ModelContract, choice: DeviceChoice) -> Any:
    path = artifact_file(contract, "ONNX file")
    providers = onnx_providers(choice)
    wanted = [p if isinstance(p, str) else p[0] for p in providers]
    missing = [p for p in wanted if p not in ort.get_available_providers()]
    if missing:
        raise ModelLoadError(
            contract.name,
            f"{choice.kind} was chosen but onnxruntime {ort.__version__} has no "
            f"{', '.join(missing)}",
            "install onnxruntime-gpu (the package with the CUDA provider) in place of "
            "onnxruntime, or serve on the CPU (--device cpu)",
            field="device",
        )
    options = ort.SessionOptions()
    options.intra_op_num_threads = choice.threads
    if choice.interop_threads is not None:
        options.inter_op_num_threads = choice.interop_threads
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own types (InvalidProtobuf, Fail, ...)
        fix = "export the model to ONNX (torch.onnx.export, tf2onnx, skl2onnx) and point to it"
        if zipfile.is_zipfile(path):
            fix = "if it is a TorchScript file set format to torchscript; else " + fix
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(contract.name, f"{path} is not an ONNX model ({first})", fix) from None


class OnnxRuntime:
    """An onnxruntime session fed and fetched by the contract's names."""

    def __init__(self, contract: ModelContract, session: Any) -> None:
        self.session = session
        self._inputs = [t.name for t in contract.inputs]
        self._outputs = [t.name for t in contract.outputs]

    def run(self, inputs: Mapping[str, Any]) -> Mapping[str, Any]:
        feed = {n: np.ascontiguousarray(inputs[n]) for n in self._inputs}
        values = self.session.run(self._outputs, feed)
        return dict(zip(self._outputs, values, strict=True))

    def synchronize(self) -> None:
        """Nothing: ``run`` returns host arrays, so the device has finished."""


def load_onnx(contract: ModelContract, choice: DeviceChoice) -> OnnxRuntime:
    """The contract's ONNX model on ``choice``'s providers, its names checked."""
    session = _session(contract, choice)
    _check_names(contract, session)
    return OnnxRuntime(contract, session)
