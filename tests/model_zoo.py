"""Small models of every format, written to disk as a user would hand them to mark.

Each builder writes its artifact under the path given and returns it; each has
a numpy reference (or, for torch, the module itself) so a test can assert that
what mark serves equals running the model directly. All are seeded: the same
call writes the same model.
"""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from bouncer.contract import Format, ModelContract, TensorSpec

Array = np.ndarray[Any, Any]


def mlp_module(n_in: int = 16, n_out: int = 4) -> torch.nn.Module:
    """A seeded MLP (``n_in`` -> 32 -> ``n_out``); also a ``pytorch`` factory
    (``tests.model_zoo:mlp_module``)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(n_in, 32), torch.nn.ReLU(), torch.nn.Linear(32, n_out)
    )
    return net.eval()


def mlp_torchscript(path: Path, n_in: int = 16, n_out: int = 4) -> Path:
    """``mlp_module`` scripted and saved with ``torch.jit.save`` at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # TorchScript is deprecated in torch 2.x, still common
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(mlp_module(n_in, n_out)), str(path))
    return path


def mlp_contract(artifact: str, n_in: int = 16, n_out: int = 4, name: str = "mlp") -> ModelContract:
    """The MLP's contract: input "input" float32 [n_in], output "output" float32 [n_out]."""
    fmt: Format = "pytorch" if ":" in artifact and not Path(artifact).exists() else "torchscript"
    return ModelContract(
        name=name,
        version="1",
        format=fmt,
        artifact=artifact,
        inputs=(TensorSpec("input", "float32", (n_in,)),),
        outputs=(TensorSpec("output", "float32", (n_out,)),),
    )


TWO_IO_INPUTS = (
    TensorSpec("tokens", "float32", (-1, 8)),
    TensorSpec("scale", "float32", (1,)),
)
TWO_IO_OUTPUTS = (TensorSpec("pooled", "float32", (8,)), TensorSpec("norm", "float32", (1,)))


def two_io_manifest(fmt: str, slo: dict[str, float], **more: object) -> dict[str, object]:
    """The two-input models' manifest (``model.yaml``) in format ``fmt``."""
    return {
        "format": fmt,
        **more,
        "inputs": [t.to_dict() for t in TWO_IO_INPUTS],
        "outputs": [t.to_dict() for t in TWO_IO_OUTPUTS],
        "slo": slo,
    }


def two_io_reference(tokens: Array, scale: Array) -> dict[str, Array]:
    """What the two-input models compute: the mean over the sequence times ``scale``,
    and that vector's sum of squares."""
    pooled = tokens.mean(axis=1) * scale
    return {"pooled": pooled, "norm": (pooled * pooled).sum(axis=1, keepdims=True)}


def two_io_onnx(path: Path) -> Path:
    """An ONNX graph (built with ``onnx.helper``, opset 18) with two named inputs,
    "tokens" float32 [batch, seq, 8] and "scale" float32 [batch, 1], and two
    outputs, "pooled" [batch, 8] and "norm" [batch, 1] (``two_io_reference``)."""
    nodes = [
        helper.make_node("ReduceMean", ["tokens", "seq_axis"], ["mean"], keepdims=0),
        helper.make_node("Mul", ["mean", "scale"], ["pooled"]),
        helper.make_node("Mul", ["pooled", "pooled"], ["squares"]),
        helper.make_node("ReduceSum", ["squares", "feature_axis"], ["norm"], keepdims=1),
    ]
    graph = helper.make_graph(
        nodes,
        "two_io",
        [
            helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "seq", 8]),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, ["batch", 1]),
        ],
        [
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", 8]),
            helper.make_tensor_value_info("norm", TensorProto.FLOAT, ["batch", 1]),
        ],
        initializer=[
            helper.make_tensor("seq_axis", TensorProto.INT64, [1], [1]),
            helper.make_tensor("feature_axis", TensorProto.INT64, [1], [1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9  # what onnxruntime 1.18 and later read
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


class TwoIO(torch.nn.Module):
    """``two_io_reference`` in torch, returning a tuple or (``as_dict``) a dict."""

    def __init__(self, as_dict: bool = False) -> None:
        super().__init__()
        self.as_dict = as_dict

    def forward(self, tokens: torch.Tensor, scale: torch.Tensor) -> Any:
        pooled = tokens.mean(dim=1) * scale
        norm = (pooled * pooled).sum(dim=1, keepdim=True)
        if self.as_dict:
            return {"pooled": pooled, "norm": norm}
        return pooled, norm


def two_io_torchscript(path: Path, as_dict: bool = False) -> Path:
    """``TwoIO`` traced and saved: the ONNX model's twin, to serve one contract in two formats."""
    example = (torch.zeros(1, 3, 8), torch.ones(1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trace warnings about a dict output's strictness
        traced = torch.jit.trace(TwoIO(as_dict), example, strict=False)  # type: ignore[no-untyped-call]
        torch.jit.save(traced, str(path))
    return path


def two_io_contract(fmt: Format, artifact: Path, name: str = "two_io") -> ModelContract:
    """The two-input models' contract in format ``fmt`` ("onnx" or "torchscript")."""
    return ModelContract(name, "1", fmt, str(artifact), TWO_IO_INPUTS, TWO_IO_OUTPUTS)


HANDLER_WEIGHTS = np.arange(12, dtype=np.float32).reshape(4, 3) / 10.0

HANDLER_SOURCE = '''
"""A handler: weights read from its directory, features doubled, a linear layer, argmax."""

from pathlib import Path

import numpy as np


class Model:
    def __init__(self, model_dir: Path) -> None:
        self.weights = np.load(model_dir / "weights.npy")

    def preprocess(self, inputs):
        return inputs["x"] * 2.0

    def predict(self, x):
        return x @ self.weights

    def postprocess(self, y):
        return {"scores": y, "label": y.argmax(axis=1)}
'''


def python_handler_dir(path: Path) -> Path:
    """A python model's directory: ``model.py`` (class ``Model``) and ``weights.npy``.
    Input "x" float32 [4]; outputs "scores" float32 [3] and "label" int64 []."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.py").write_text(textwrap.dedent(HANDLER_SOURCE).lstrip())
    np.save(path / "weights.npy", HANDLER_WEIGHTS)
    return path


def python_handler_reference(x: Array) -> dict[str, Array]:
    """What ``python_handler_dir``'s model computes."""
    scores = (x * 2.0) @ HANDLER_WEIGHTS
    return {"scores": scores, "label": scores.argmax(axis=1)}


def python_handler_contract(artifact: Path, name: str = "handler") -> ModelContract:
    """The handler's contract."""
    return ModelContract(
        name,
        "1",
        "python",
        str(artifact),
        (TensorSpec("x", "float32", (4,)),),
        (TensorSpec("scores", "float32", (3,)), TensorSpec("label", "int64", ())),
    )
