"""The model contract: what a model takes and gives, as every hop that runs it reads it.

A model has named inputs and named outputs, each a ``TensorSpec``: its element
type and one instance's shape (no batch dimension), where ``-1`` is a variable
dimension (a sequence length, say). Requests are batched only with requests of
the same instance shapes (``mark.serve.dispatcher``), so a model with a variable dimension
sees batches of one length each, as Triton's dynamic batcher forms them.

The contract travels as JSON (``to_json``/``from_json``) from the daemon to its
agents and the spill function: it is plain data, so this module imports only
numpy, and the agent, the spill function and the frontend agree on it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np

Format = Literal["torchscript", "onnx", "python", "pytorch"]
FORMATS: tuple[Format, ...] = ("torchscript", "onnx", "python", "pytorch")
"""torchscript: a ``torch.jit`` file; onnx: an ``.onnx`` file run by onnxruntime;
python: a handler class (load, preprocess, predict, postprocess); pytorch:
``package.module:factory`` returning a ``torch.nn.Module``."""

DTYPES = (
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
)
"""The element types a tensor may have (numpy's names)."""

Inputs = dict[str, np.ndarray[Any, Any]]
"""A batch's tensors by name, each with the batch as its first dimension."""


class ContractError(ValueError):
    """A tensor, or a contract, that does not hold; the message says which and why."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One named tensor: element type and one instance's shape (``-1``: variable;
    ``None``, outputs only: not declared, any shape: a model configured without a manifest)."""

    name: str
    dtype: str
    shape: tuple[int, ...] | None

    @property
    def variable(self) -> bool:
        return self.shape is None or any(d == -1 for d in self.shape)

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether one instance of ``shape`` fits this spec."""
        if self.shape is None:
            return True
        return len(shape) == len(self.shape) and all(
            w == -1 or w == g for w, g in zip(self.shape, shape, strict=True)
        )

    def example(self, batch: int = 1, variable: int = 1) -> np.ndarray[Any, Any]:
        """Zeros of this spec's type and shape, ``variable`` for each ``-1``."""
        dims = tuple(variable if d == -1 else d for d in self.shape or ())
        return np.zeros((batch, *dims), dtype=self.dtype)

    def batch_shape(self) -> list[int]:
        """The shape with the batch dimension, as V2 metadata reports it (``-1``: any)."""
        return [-1, *self.shape] if self.shape is not None else [-1]

    def to_dict(self) -> dict[str, Any]:
        shape = list(self.shape) if self.shape is not None else None
        return {"name": self.name, "dtype": self.dtype, "shape": shape}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorSpec:
        shape = d["shape"]
        dims = tuple(int(x) for x in shape) if shape is not None else None
        return cls(str(d["name"]), str(d["dtype"]), dims)


@dataclass(frozen=True, slots=True)
class VariantArtifact:
    """One variant of a model as runners load it (``mark.config.variants``): the model's
    tensors with its own artifact; its accuracy is what the variant rule weighs."""

    name: str
    format: Format
    artifact: str
    handler: str | None
    accuracy: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "format": self.format,
            "artifact": self.artifact,
            "handler": self.handler,
            "accuracy": self.accuracy,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> VariantArtifact:
        fmt = d["format"]
        if fmt not in FORMATS:
            raise ContractError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
        return cls(
            name=str(d["name"]),
            format=cast(Format, fmt),
            artifact=str(d["artifact"]),
            handler=d.get("handler"),
            accuracy=float(d["accuracy"]),
        )


@dataclass(frozen=True, slots=True)
class ModelContract:
    """A model as its runners load it: name, version, format, artifact and tensors.

    ``artifact`` is a path (a file for torchscript and onnx, the handler's file or
    directory for python) or, for pytorch, ``package.module:factory``; ``handler``
    names the class in a python model's file (default ``Model``). ``variants``, most
    accurate first, are the model's variants where it has them (the first is the
    model's own artifact); ``variant(name)`` is the contract that runs one.
    """

    name: str
    version: str
    format: Format
    artifact: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    handler: str | None = None
    variants: tuple[VariantArtifact, ...] = ()

    def variant(self, name: str) -> ModelContract:
        """The contract that runs variant ``name`` (``ContractError`` if there is none)."""
        for v in self.variants:
            if v.name == name:
                return replace(
                    self, format=v.format, artifact=v.artifact, handler=v.handler, variants=()
                )
        known = ", ".join(v.name for v in self.variants) or "none"
        raise ContractError(f"model {self.name!r} has no variant {name!r} (its variants: {known})")

    @property
    def variable(self) -> bool:
        return any(t.variable for t in self.inputs)

    def example(self, batch: int = 1, variable: int = 1) -> Inputs:
        """A batch of zeros for every input (``variable`` for each ``-1``)."""
        return {t.name: t.example(batch, variable) for t in self.inputs}

    def to_json(self) -> str:
        return json.dumps(
            {
                "name": self.name,
                "version": self.version,
                "format": self.format,
                "artifact": self.artifact,
                "handler": self.handler,
                "inputs": [t.to_dict() for t in self.inputs],
                "outputs": [t.to_dict() for t in self.outputs],
                **({"variants": [v.to_dict() for v in self.variants]} if self.variants else {}),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> ModelContract:
        try:
            d = json.loads(text)
            fmt = d["format"]
            if fmt not in FORMATS:
                raise ContractError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
            return cls(
                name=str(d["name"]),
                version=str(d["version"]),
                format=cast(Format, fmt),
                artifact=str(d["artifact"]),
                handler=d.get("handler"),
                inputs=tuple(TensorSpec.from_dict(t) for t in d["inputs"]),
                outputs=tuple(TensorSpec.from_dict(t) for t in d["outputs"]),
                variants=tuple(VariantArtifact.from_dict(v) for v in d.get("variants", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ContractError):
                raise
            raise ContractError(f"not a model contract: {type(exc).__name__}: {exc}") from None


def infer_format(source: str) -> Format:
    """The format a source names when none is declared: ``.onnx`` is ONNX, ``.py`` a
    Python handler, ``package.module:factory`` a PyTorch factory, any other file TorchScript."""
    if source.endswith(".onnx"):
        return "onnx"
    if source.endswith(".py"):
        return "python"
    if ":" in source and not source.startswith("s3://") and not Path(source).exists():
        return "pytorch"
    return "torchscript"


def legacy_contract(name: str, source: str, shape: tuple[int, ...], dtype: str) -> ModelContract:
    """A model given as a source, one input's shape and dtype: input ``input``, output
    ``output`` of any shape, the format read off the source (``.onnx``, a factory)."""
    return ModelContract(
        name=name,
        version="1",
        format=infer_format(source),
        artifact=source,
        inputs=(TensorSpec("input", dtype, shape),),
        outputs=(TensorSpec("output", "float32", None),),
    )


def check_outputs(contract: ModelContract, outputs: Mapping[str, Any], batch: int) -> Inputs:
    """The outputs a runner produced, as arrays of the declared types, or ``ContractError``
    naming the output and what differs (a missing or unknown name, the batch size, a shape).

    Values are cast to the declared type, so every runner (an instance, the spill function)
    hands back the same numbers in the same precision; an undeclared output (shape
    ``None``: a model given as a bare source) keeps the model's own type.
    """
    declared = {t.name: t for t in contract.outputs}
    missing = [n for n in declared if n not in outputs]
    if missing:
        got = ", ".join(repr(n) for n in outputs) or "none"
        raise ContractError(
            f"model {contract.name!r} gave no output {', '.join(map(repr, missing))} "
            f"(it gave {got}); the manifest's outputs must name what the model returns"
        )
    out: Inputs = {}
    for name, spec in declared.items():
        arr = np.asarray(outputs[name])
        if arr.ndim == 0 or arr.shape[0] != batch:
            raise ContractError(
                f"model {contract.name!r} output {name!r} has shape {list(arr.shape)} for a "
                f"batch of {batch}: its first dimension must be the batch"
            )
        if not spec.fits(tuple(arr.shape[1:])):
            raise ContractError(
                f"model {contract.name!r} output {name!r} has instance shape "
                f"{list(arr.shape[1:])}, the manifest says {list(spec.shape or ())}"
            )
        if spec.shape is None:  # undeclared (a bare source): the model's own type
            out[name] = arr
            continue
        try:
            out[name] = arr.astype(spec.dtype, copy=False)
        except (TypeError, ValueError) as exc:
            raise ContractError(
                f"model {contract.name!r} output {name!r} is {arr.dtype}, not castable to "
                f"{spec.dtype}: {exc}"
            ) from None
    return out
