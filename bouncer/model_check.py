"""Check a model against its contract before it is served: load it, run it once, compare.

A contract that does not hold would otherwise fail on the first request, on an
instance, far from the manifest that is wrong. ``check_model`` loads the model
on the CPU with one thread, runs a batch of 2 zeros (3 for each variable
dimension) and compares what comes back with what the contract declares. The
first thing wrong is raised as a ``ModelCheckError`` naming the model, the
contract's field, what is wrong and the fix. Outputs declared without a shape
(``None``) come back filled in with what the model returned.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from bouncer.contract import ContractError, Inputs, ModelContract, TensorSpec, check_outputs
from bouncer.device import DeviceChoice
from bouncer.runtimes import ModelLoadError, Runtime, load_runtime

BATCH = 2
VARIABLE = (3, 4)  # two lengths: an output dimension that follows them is variable too


class ModelCheckError(ValueError):
    """The model does not match its contract at ``field`` (``inputs[0].shape``, ...)."""

    def __init__(self, model: str, field: str, message: str, fix: str) -> None:
        self.model, self.field, self.message, self.fix = model, field, message, fix
        super().__init__(f"model {model!r}: {field}: {message.rstrip('.')}. Fix: {fix}")


def _gist(exc: BaseException) -> str:
    """A runtime's error on one line: TorchScript's last line (the interpreter's traceback
    comes first), onnxruntime's without its status prefix and closing advice."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    if "Traceback of TorchScript" in str(exc):
        return lines[-1].removeprefix("RuntimeError: ")
    lines = [ln for ln in lines if not ln.startswith("Please fix either")]
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", " ".join(lines)).rstrip(".")


def _blamed_input(contract: ModelContract, example: Inputs, gist: str) -> tuple[str, str]:
    """(field, batch shape) of the input a runtime's error is about: the only input, or the
    one the error names (onnxruntime does); else all of them."""
    named = [
        i for i, t in enumerate(contract.inputs) if re.search(rf"\b{re.escape(t.name)}\b", gist)
    ]
    if len(contract.inputs) == 1 or len(named) == 1:
        i = named[0] if len(named) == 1 else 0
        spec = contract.inputs[i]
        return f"inputs[{i}].shape {list(spec.shape or ())}", str(list(example[spec.name].shape))
    fields = ", ".join(f"{t.name} {list(t.shape or ())}" for t in contract.inputs)
    return f"inputs {fields}", ", ".join(str(list(a.shape)) for a in example.values())


def _run(contract: ModelContract, runtime: Runtime, example: Inputs) -> Mapping[str, Any]:
    try:
        return runtime.run(example)
    except ContractError as exc:  # the model's result has another shape than the outputs'
        raise ModelCheckError(
            contract.name, "outputs", str(exc), "declare the outputs the model returns"
        ) from None
    except Exception as exc:  # the model rejected the inputs; its error says how
        gist = _gist(exc)
        field, shapes = _blamed_input(contract, example, gist)
        raise ModelCheckError(
            contract.name,
            field,
            f"the model cannot run a batch of shape {shapes}: {gist}",
            "set each input's shape and dtype to what the model takes (its error above "
            "says what it got)",
        ) from None


def _check_raw(contract: ModelContract, raw: Mapping[str, Any]) -> None:
    """The outputs' names, batch dimension, shapes and types, each with its field."""
    given = ", ".join(map(repr, raw)) or "none"
    for i, spec in enumerate(contract.outputs):
        if spec.name not in raw:
            raise ModelCheckError(
                contract.name,
                f"outputs[{i}].name {spec.name!r}",
                f"the model returns no output {spec.name!r}; it returns {given}",
                f"name the outputs as the model returns them ({given})",
            )
        arr = np.asarray(raw[spec.name])
        if arr.ndim == 0 or arr.shape[0] != BATCH:
            raise ModelCheckError(
                contract.name,
                f"outputs[{i}]",
                f"output {spec.name!r} has shape {list(arr.shape)} for a batch of {BATCH}",
                "make the model return the batch as each output's first dimension",
            )
        if not spec.fits(tuple(arr.shape[1:])):
            raise ModelCheckError(
                contract.name,
                f"outputs[{i}].shape {list(spec.shape or ())}",
                f"the model returns instance shape {list(arr.shape[1:])}",
                f"set the shape to {list(arr.shape[1:])} (-1 for a dimension that varies)",
            )
        if not np.can_cast(arr.dtype, spec.dtype, casting="same_kind"):
            raise ModelCheckError(
                contract.name,
                f"outputs[{i}].dtype {spec.dtype}",
                f"the model returns {arr.dtype}, which does not cast to {spec.dtype}",
                f"set the dtype to {arr.dtype}",
            )


def _measured(spec: TensorSpec, shapes: list[tuple[int, ...]]) -> TensorSpec:
    """An undeclared output's instance shape as measured: -1 where the runs differ."""
    if spec.shape is not None:
        return spec
    first = shapes[0]
    if any(len(s) != len(first) for s in shapes):
        return spec  # the rank itself varies: leave it undeclared
    dims = tuple(d if all(s[k] == d for s in shapes) else -1 for k, d in enumerate(first))
    return replace(spec, shape=dims)


INTERFACE_FIX = "every variant must take the model's inputs and give its outputs"


def check_model(contract: ModelContract) -> ModelContract:
    """``contract`` with its undeclared output shapes filled in, or a ``ModelCheckError``;
    each of its other variants checked too, and held to the outputs the model's own gives
    (every variant serves the same interface)."""
    learnt = _check_one(contract)
    for v in contract.variants[1:]:
        try:
            other = _check_one(replace(contract.variant(v.name), outputs=contract.outputs))
        except ModelCheckError as exc:
            tensors = exc.field.startswith(("inputs", "outputs"))
            fix = INTERFACE_FIX if tensors else exc.fix  # the manifest's tensors are the model's
            raise ModelCheckError(
                contract.name, f"variant {v.name!r}: {exc.field}", exc.message, fix
            ) from None
        for mine, theirs in zip(learnt.outputs, other.outputs, strict=True):
            if mine.shape != theirs.shape:
                raise ModelCheckError(
                    contract.name,
                    f"variant {v.name!r}: outputs",
                    f"output {mine.name!r} has instance shape {list(theirs.shape or ())}, the "
                    f"model's own gives {list(mine.shape or ())}",
                    INTERFACE_FIX,
                )
    return learnt


def _check_one(contract: ModelContract) -> ModelContract:
    try:
        runtime = load_runtime(contract, DeviceChoice.cpu(1, why="checking the model"))
    except ModelLoadError as exc:
        raise ModelCheckError(contract.name, exc.field, exc.problem, exc.fix) from None
    lengths = VARIABLE if contract.variable else VARIABLE[:1]
    shapes: dict[str, list[tuple[int, ...]]] = {t.name: [] for t in contract.outputs}
    for n in lengths:
        example = contract.example(BATCH, variable=n)
        raw = _run(contract, runtime, example)
        _check_raw(contract, raw)
        try:
            checked = check_outputs(contract, raw, BATCH)
        except ContractError as exc:
            raise ModelCheckError(
                contract.name, "outputs", str(exc), "declare what the model returns"
            ) from None
        for name, arr in checked.items():
            shapes[name].append(tuple(arr.shape[1:]))
    outputs = tuple(_measured(t, shapes[t.name]) for t in contract.outputs)
    return replace(contract, outputs=outputs)
