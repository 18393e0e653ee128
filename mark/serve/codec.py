"""Request and response bodies of the two protocols clients speak.

- TF-Serving V1: ``{"instances": [...]}`` in, ``{"predictions": [...]}`` out.
- Open Inference Protocol V2 (KServe, Triton): ``{"inputs": [{"name", "shape",
  "datatype", "data"}]}`` in, ``{"model_name", "outputs": [...]}`` out; with the
  binary tensor data extension (``mark.serve.binary_tensors``), tensors may
  travel as raw bytes after the JSON object, in either direction.

Parsing is strict and pure: any mistake a client can make becomes a
``BadRequest`` with a status and a message saying what was wrong, never a 500.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from bouncer.contract import TensorSpec
from bouncer.wire import dump_json
from mark.serve import binary_tensors

V2_TYPES: dict[str, str] = {
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "uint8": "UINT8",
    "bool": "BOOL",
}
FROM_V2 = {v: k for k, v in V2_TYPES.items()}


class BadRequest(Exception):
    """A client error: ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __reduce__(self) -> tuple[type[BadRequest], tuple[int, str]]:
        # Raised in the parser processes too (``mark.serve.endpoint``): it must unpickle.
        return BadRequest, (self.status, self.message)


@dataclass(frozen=True)
class Tensor:
    """A validated batch: ``array.shape == (n, *schema.shape)``."""

    array: np.ndarray[Any, Any]
    input_name: str | None = None  # V2 input name, echoed in errors

    @property
    def n(self) -> int:
        return int(self.array.shape[0])


def parse_json(body: bytes) -> Any:
    """Strict RFC 8259 JSON (no NaN/Infinity literals, integers within 64 bits)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(400, f"body is not valid JSON: {exc}") from None


def split_v2(body: bytes, header_length: str | None) -> tuple[Any, bytes]:
    """A V2 request body: its JSON object, parsed, and the binary tensor data after it.

    ``header_length`` is the ``Inference-Header-Content-Length`` header, if sent.
    """
    try:
        head, binary = binary_tensors.split_body(body, header_length)
    except ValueError as exc:
        raise BadRequest(400, str(exc)) from None
    return parse_json(head), binary


@dataclass(frozen=True)
class V2Request:
    """A V2 request parsed: its input, whether it wants binary output, and its id."""

    tensor: Tensor
    binary_output: bool
    request_id: str | None


def read_v1(body: bytes, schema: TensorSpec, max_batch: int) -> Tensor:
    """A V1 request body, bytes to validated tensor (one call, so it can run elsewhere)."""
    return parse_v1(parse_json(body), schema, max_batch)


def read_v2(
    body: bytes,
    header_length: str | None,
    schema: TensorSpec,
    max_batch: int,
    output: str = "output",
) -> V2Request:
    """A V2 request body, bytes to validated tensor and output wishes (one call, so it can
    run elsewhere)."""
    obj, binary = split_v2(body, header_length)
    tensor = parse_v2(obj, schema, max_batch, binary)
    request_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    return V2Request(tensor, parse_v2_outputs(obj, output), request_id)


def _parameters(obj: Mapping[str, Any], what: str) -> Mapping[str, Any]:
    params = obj.get("parameters", {})
    if not isinstance(params, Mapping):
        raise BadRequest(400, f'"parameters" of {what} must be an object')
    if "shared_memory_region" in params:
        raise BadRequest(
            400, f"{what} names a shared memory region; mark takes tensors in the body only"
        )
    return params


def _to_array(data: Any, schema: TensorSpec, what: str) -> np.ndarray[Any, Any]:
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError):
        raise BadRequest(400, f"{what} is not a regular (rectangular) array") from None
    if arr.dtype == object:
        raise BadRequest(400, f"{what} is not a regular (rectangular) array of numbers")
    if arr.dtype.kind not in "biuf":
        raise BadRequest(400, f"{what} must hold numbers, got {arr.dtype.kind!r} values")
    want = np.dtype(schema.dtype)
    if want.kind == "f":
        # The common case, kept to one pass: cast, then one finiteness check.
        with np.errstate(over="ignore", invalid="ignore"):
            out = arr.astype(want, copy=False)
        if out.size and not np.isfinite(out).all():
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise BadRequest(400, f"{what} holds NaN or infinite values")
            raise BadRequest(400, f"{what} has values outside the range of {schema.dtype}")
        return out
    if arr.dtype.kind == "f" and not (np.isfinite(arr).all() and (arr == np.round(arr)).all()):
        raise BadRequest(400, f"{what} must be integers for dtype {schema.dtype}")
    if want.kind in "iu" and arr.size:
        info = np.iinfo(want)
        if arr.min() < info.min or arr.max() > info.max:
            raise BadRequest(400, f"{what} has values outside the range of {schema.dtype}")
    return arr.astype(want, copy=False)


def _check_shape(arr: np.ndarray[Any, Any], schema: TensorSpec, what: str) -> None:
    if arr.ndim < 1 or arr.shape[0] == 0:
        raise BadRequest(400, f"{what} is empty: send at least one instance")
    if not schema.fits(tuple(arr.shape[1:])) or 0 in arr.shape[1:]:
        raise BadRequest(
            400,
            f"{what} has instance shape {list(arr.shape[1:])}, the model expects "
            f"{list(schema.shape or ())}" + (" (-1: any length)" if schema.variable else ""),
        )


def parse_v1(body: Any, schema: TensorSpec, max_batch: int) -> Tensor:
    if not isinstance(body, Mapping):
        raise BadRequest(400, 'body must be a JSON object like {"instances": [...]}')
    if "instances" not in body:
        raise BadRequest(400, 'missing field "instances"')
    instances = body["instances"]
    if not isinstance(instances, list):
        raise BadRequest(400, '"instances" must be a list')
    if len(instances) > max_batch:
        raise BadRequest(
            413, f"{len(instances)} instances in one request; the limit is {max_batch}"
        )
    arr = _to_array(instances, schema, '"instances"')
    _check_shape(arr, schema, '"instances"')
    return Tensor(arr)


def parse_v2(body: Any, schema: TensorSpec, max_batch: int, binary: bytes = b"") -> Tensor:
    """The input tensor of a V2 request; ``binary`` is the data after its JSON object."""
    if not isinstance(body, Mapping):
        raise BadRequest(400, 'body must be a JSON object like {"inputs": [...]}')
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest(400, 'missing or empty field "inputs"')
    if len(inputs) != 1:
        raise BadRequest(400, f"the model takes exactly 1 input tensor, got {len(inputs)}")
    inp = inputs[0]
    if not isinstance(inp, Mapping):
        raise BadRequest(400, "each input must be an object with name, shape, datatype, data")
    for key in ("name", "shape", "datatype"):
        if key not in inp:
            raise BadRequest(400, f'input is missing field "{key}"')
    name, shape, datatype = inp["name"], inp["shape"], inp["datatype"]
    if not isinstance(name, str):
        raise BadRequest(400, '"name" must be a string')
    if name != schema.name:
        raise BadRequest(400, f"unknown input {name!r}; the model takes {schema.name!r}")
    what = f'input "{name}"'
    params = _parameters(inp, what)
    size = params.get("binary_data_size")
    if size is None and "data" not in inp:
        raise BadRequest(400, 'input is missing field "data"')
    if size is not None and "data" in inp:
        raise BadRequest(400, f'{what} has both "data" and a "binary_data_size": send one')
    if (
        not isinstance(shape, list)
        or not shape
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise BadRequest(400, '"shape" must be a non-empty list of non-negative integers')
    expected_type = V2_TYPES[schema.dtype]
    if datatype != expected_type:
        raise BadRequest(400, f'"datatype" is {datatype!r}; the model takes {expected_type!r}')
    if shape[0] > max_batch:
        raise BadRequest(413, f"batch of {shape[0]} in one request; the limit is {max_batch}")
    if not schema.fits(tuple(shape[1:])):
        raise BadRequest(
            400, f'"shape" {shape} does not match the model input {schema.batch_shape()}'
        )
    count = math.prod(shape)
    if size is None:
        if binary:
            raise BadRequest(
                400,
                f"{len(binary)} bytes follow the JSON object, "
                'but no input has a "binary_data_size" parameter',
            )
        arr = _to_array(inp["data"], schema, f"{what} data")
        if arr.size != count:
            raise BadRequest(400, f"{what} has {arr.size} values; shape {shape} needs {count}")
    else:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadRequest(400, f'"binary_data_size" of {what} must be a byte count')
        if size != len(binary):
            raise BadRequest(
                400,
                f'{what} has "binary_data_size" {size}, but {len(binary)} bytes follow the '
                "JSON object (is the Inference-Header-Content-Length header right?)",
            )
        try:
            flat = binary_tensors.decode(datatype, binary, count)
        except ValueError as exc:
            raise BadRequest(400, f"{what}: {exc}") from None
        arr = _to_array(flat, schema, f"{what} data")
    arr = arr.reshape(shape)
    _check_shape(arr, schema, what)
    return Tensor(arr, input_name=name)


def parse_v2_outputs(body: Mapping[str, Any], output: str = "output") -> bool:
    """Whether a V2 request (already parsed by ``parse_v2``) wants its output as binary data.

    ``"outputs"``, if sent, may only name the model's output; a requested output's
    ``"binary_data"`` overrides the request's ``"binary_data_output"`` (default false).
    """
    binary = _parameters(body, "the request").get("binary_data_output", False)
    if not isinstance(binary, bool):
        raise BadRequest(400, '"binary_data_output" must be true or false')
    outputs = body.get("outputs")
    if outputs is None:
        return binary
    if not isinstance(outputs, list):
        raise BadRequest(400, f'"outputs" must be a list of objects like {{"name": "{output}"}}')
    wanted = binary
    for out in outputs:
        if not isinstance(out, Mapping) or not isinstance(out.get("name"), str):
            raise BadRequest(400, 'each requested output must be an object with a "name"')
        if out["name"] != output:
            raise BadRequest(400, f"unknown output {out['name']!r}; the model has one, {output!r}")
        params = _parameters(out, f'output "{output}"')
        if "classification" in params:
            raise BadRequest(400, "the classification extension is not supported")
        wanted = params.get("binary_data", binary)
        if not isinstance(wanted, bool):
            raise BadRequest(400, '"binary_data" must be true or false')
    return wanted


def output_array(outputs: Sequence[Any], spec: TensorSpec) -> np.ndarray[Any, Any]:
    """The rows' outputs as one array of the declared type. Outputs cross JSON (from an
    agent, from Lambda) as decimal text of any precision; cast to the model's type, every
    answer prints the same number whoever served it. An undeclared output (a model
    configured without a manifest) keeps integers and takes floats as float32, the type
    such models compute in."""
    arr = np.asarray(outputs)
    want = spec.dtype if spec.shape is not None else "float32" if arr.dtype.kind == "f" else None
    with np.errstate(over="ignore", invalid="ignore"):  # out of range: inf, as the model's
        return arr.astype(want, copy=False) if want is not None else arr


def encode_v1(outputs: Sequence[Any], spec: TensorSpec) -> dict[str, Any]:
    return {"predictions": output_array(outputs, spec)}


def encode_v2(
    model: str, outputs: Sequence[Any], request_id: str | None, spec: TensorSpec
) -> dict[str, Any]:
    arr = output_array(outputs, spec)
    body: dict[str, Any] = {
        "model_name": model,
        "outputs": [
            {
                "name": spec.name,
                "shape": list(arr.shape),
                "datatype": V2_TYPES[spec.dtype],
                "data": arr.ravel(),
            }
        ],
    }
    if request_id is not None:
        body["id"] = request_id
    return body


def encode_v2_binary(
    model: str, outputs: Sequence[Any], request_id: str | None, spec: TensorSpec
) -> tuple[bytes, int]:
    """The V2 response with the output as binary data, and the length of its JSON object.

    The body is the JSON object, then the output's bytes; the length goes in the
    ``Inference-Header-Content-Length`` header.
    """
    body = encode_v2(model, outputs, request_id, spec)
    (out,) = body["outputs"]
    raw = binary_tensors.encode(out.pop("data"), out["datatype"])
    out["parameters"] = {"binary_data_size": len(raw)}
    head = dump_json(body)
    return head + raw, len(head)
