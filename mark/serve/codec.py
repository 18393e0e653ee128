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
from dataclasses import dataclass, field
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


Specs = TensorSpec | Sequence[TensorSpec]
"""A model's inputs (or outputs): one spec, or several."""


def _specs(specs: Specs) -> tuple[TensorSpec, ...]:
    return (specs,) if isinstance(specs, TensorSpec) else tuple(specs)


@dataclass(frozen=True)
class Tensor:
    """A validated request: each input's array, all with the same first dimension ``n``.

    ``columnar``: a V1 request in the columnar form (``{"inputs": ...}``), answered in
    the same form (``{"outputs": ...}``)."""

    arrays: dict[str, np.ndarray[Any, Any]]
    input_name: str | None = None  # the first V2 input's name, echoed in errors
    columnar: bool = False

    @property
    def n(self) -> int:
        return int(next(iter(self.arrays.values())).shape[0])

    @property
    def array(self) -> np.ndarray[Any, Any]:
        """The one input's array (a model with one input)."""
        (only,) = self.arrays.values()
        return only


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
    """A V2 request parsed: its inputs, the outputs it wants (name: as binary data?),
    and its id."""

    tensor: Tensor
    outputs: dict[str, bool]
    request_id: str | None
    parameters: dict[str, Any] = field(default_factory=dict)
    """The request's ``parameters`` (a pinned ``variant``, an ``accuracy_floor``)."""

    @property
    def binary_output(self) -> bool:
        """Whether any output goes back as binary data (the response is then binary)."""
        return any(self.outputs.values())


def read_v1(body: bytes, inputs: Specs, max_batch: int) -> Tensor:
    """A V1 request body, bytes to validated tensors (one call, so it can run elsewhere)."""
    return parse_v1(parse_json(body), inputs, max_batch)


def read_v2(
    body: bytes,
    header_length: str | None,
    inputs: Specs,
    max_batch: int,
    outputs: Specs = TensorSpec("output", "float32", None),
) -> V2Request:
    """A V2 request body, bytes to validated tensors and output wishes (one call, so it
    can run elsewhere)."""
    obj, binary = split_v2(body, header_length)
    tensor = parse_v2(obj, inputs, max_batch, binary)
    request_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    params = dict(_parameters(obj, "the request"))
    return V2Request(tensor, parse_v2_outputs(obj, outputs), request_id, params)


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


def _v1_batch(data: Any, spec: TensorSpec, what: str, max_batch: int) -> np.ndarray[Any, Any]:
    if not isinstance(data, list):
        raise BadRequest(400, f"{what} must be a list (one entry per instance)")
    if len(data) > max_batch:
        raise BadRequest(413, f"{len(data)} instances in one request; the limit is {max_batch}")
    arr = _to_array(data, spec, what)
    _check_shape(arr, spec, what)
    return arr


def _same_n(arrays: Mapping[str, np.ndarray[Any, Any]]) -> None:
    sizes = {name: int(a.shape[0]) for name, a in arrays.items()}
    if len(set(sizes.values())) > 1:
        raise BadRequest(400, f"the inputs disagree on the batch size: {sizes}")


def parse_v1(body: Any, inputs: Specs, max_batch: int) -> Tensor:
    """TF-Serving's predict request, in its row form (``{"instances": [...]}``, each
    instance an object by input name when the model has several) or its columnar form
    (``{"inputs": {name: [...]}}``, or the one input's list)."""
    specs = _specs(inputs)
    if not isinstance(body, Mapping):
        raise BadRequest(400, 'body must be a JSON object like {"instances": [...]}')
    if "instances" not in body and "inputs" not in body:
        raise BadRequest(400, 'missing field "instances" (rows), or "inputs" (columns)')
    if "instances" in body and "inputs" in body:
        raise BadRequest(400, 'give "instances" (rows) or "inputs" (columns), not both')
    if "inputs" in body:
        columns = body["inputs"]
        if not isinstance(columns, Mapping):
            if len(specs) != 1:
                raise BadRequest(400, '"inputs" must be an object by input name')
            columns = {specs[0].name: columns}
        _names(columns, specs)
        arrays = {
            t.name: _v1_batch(columns[t.name], t, f'"inputs.{t.name}"', max_batch) for t in specs
        }
        _same_n(arrays)
        return Tensor(arrays, columnar=True)
    instances = body["instances"]
    if not isinstance(instances, list):
        raise BadRequest(400, '"instances" must be a list')
    if len(specs) == 1:
        return Tensor({specs[0].name: _v1_batch(instances, specs[0], '"instances"', max_batch)})
    if len(instances) > max_batch:
        raise BadRequest(
            413, f"{len(instances)} instances in one request; the limit is {max_batch}"
        )
    if not instances or not all(isinstance(i, Mapping) for i in instances):
        names = ", ".join(t.name for t in specs)
        raise BadRequest(400, f"each instance must be an object with the inputs {names}")
    for i in instances:
        _names(i, specs)
    arrays = {
        t.name: _v1_batch([i[t.name] for i in instances], t, f'"instances[].{t.name}"', max_batch)
        for t in specs
    }
    return Tensor(arrays)


def _names(given: Mapping[str, Any], specs: Sequence[TensorSpec]) -> None:
    want = [t.name for t in specs]
    missing = [n for n in want if n not in given]
    unknown = [n for n in given if n not in want]
    if missing or unknown:
        raise BadRequest(
            400,
            f"the model takes the inputs {want}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unknown {unknown}" if unknown else ""),
        )


def parse_v2(body: Any, inputs: Specs, max_batch: int, binary: bytes = b"") -> Tensor:
    """The input tensors of a V2 request, every one the model takes, by name; ``binary``
    is the data after its JSON object (the binary inputs' bytes, in the inputs' order)."""
    specs = _specs(inputs)
    by_name = {t.name: t for t in specs}
    if not isinstance(body, Mapping):
        raise BadRequest(400, 'body must be a JSON object like {"inputs": [...]}')
    given = body.get("inputs")
    if not isinstance(given, list) or not given:
        raise BadRequest(400, 'missing or empty field "inputs"')
    if len(given) > len(specs):
        raise BadRequest(400, f"the model takes {len(specs)} input tensor(s), got {len(given)}")
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    offset = 0
    first: str | None = None
    for inp in given:
        if not isinstance(inp, Mapping):
            raise BadRequest(400, "each input must be an object with name, shape, datatype, data")
        for key in ("name", "shape", "datatype"):
            if key not in inp:
                raise BadRequest(400, f'input is missing field "{key}"')
        name, shape, datatype = inp["name"], inp["shape"], inp["datatype"]
        if not isinstance(name, str):
            raise BadRequest(400, '"name" must be a string')
        schema = by_name.get(name) if isinstance(name, str) else None
        if schema is None:
            raise BadRequest(400, f"unknown input {name!r}; the model takes {list(by_name)}")
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
            arr = _to_array(inp["data"], schema, f"{what} data")
            if arr.size != count:
                raise BadRequest(400, f"{what} has {arr.size} values; shape {shape} needs {count}")
        else:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise BadRequest(400, f'"binary_data_size" of {what} must be a byte count')
            if size > len(binary) - offset:
                raise BadRequest(
                    400,
                    f'{what} has "binary_data_size" {size}, but {len(binary) - offset} bytes '
                    "follow the JSON object (is the Inference-Header-Content-Length header right?)",
                )
            raw = binary[offset : offset + size]
            offset += size
            try:
                flat = binary_tensors.decode(datatype, raw, count)
            except ValueError as exc:
                raise BadRequest(400, f"{what}: {exc}") from None
            arr = _to_array(flat, schema, f"{what} data")
        arr = arr.reshape(shape)
        _check_shape(arr, schema, what)
        if name in arrays:
            raise BadRequest(400, f"input {name!r} is given twice")
        arrays[name] = arr
        first = first if first is not None else name
    if offset != len(binary):
        raise BadRequest(
            400,
            f"{len(binary) - offset} bytes follow the JSON object that no input's "
            '"binary_data_size" accounts for',
        )
    _names(arrays, specs)
    _same_n(arrays)
    return Tensor({t.name: arrays[t.name] for t in specs}, input_name=first)


def parse_v2_outputs(body: Mapping[str, Any], outputs: Specs) -> dict[str, bool]:
    """The outputs a V2 request wants (all the model's unless it names some), each with
    whether it goes back as binary data: a requested output's ``"binary_data"``, else
    the request's ``"binary_data_output"`` (default false)."""
    specs = _specs(outputs)
    binary = _parameters(body, "the request").get("binary_data_output", False)
    if not isinstance(binary, bool):
        raise BadRequest(400, '"binary_data_output" must be true or false')
    requested = body.get("outputs")
    if requested is None:
        return {t.name: binary for t in specs}
    names = [t.name for t in specs]
    if not isinstance(requested, list):
        raise BadRequest(400, f'"outputs" must be a list of objects like {{"name": "{names[0]}"}}')
    wanted: dict[str, bool] = {}
    for out in requested:
        if not isinstance(out, Mapping) or not isinstance(out.get("name"), str):
            raise BadRequest(400, 'each requested output must be an object with a "name"')
        name = out["name"]
        if name not in names:
            raise BadRequest(400, f"unknown output {name!r}; the model's outputs are {names}")
        params = _parameters(out, f'output "{name}"')
        if "classification" in params:
            raise BadRequest(400, "the classification extension is not supported")
        flag = params.get("binary_data", binary)
        if not isinstance(flag, bool):
            raise BadRequest(400, '"binary_data" must be true or false')
        wanted[name] = flag
    return wanted or {t.name: binary for t in specs}


def output_array(outputs: Sequence[Any], spec: TensorSpec) -> np.ndarray[Any, Any]:
    """The rows' values of one output as one array of the declared type. Outputs cross
    JSON (from an agent, from Lambda) as decimal text of any precision; cast to the
    model's type, every answer prints the same number whoever served it. An undeclared
    output (a model configured without a manifest) keeps integers and takes floats as
    float32, the type such models compute in."""
    arr = np.asarray(outputs)
    want = spec.dtype if spec.shape is not None else "float32" if arr.dtype.kind == "f" else None
    with np.errstate(over="ignore", invalid="ignore"):  # out of range: inf, as the model's
        return arr.astype(want, copy=False) if want is not None else arr


def output_arrays(rows: Sequence[Any], outputs: Specs) -> dict[str, np.ndarray[Any, Any]]:
    """Each output's array from the rows' outputs: each row a mapping by output name, or
    (a model with one output) that output's value."""
    return {
        t.name: output_array([r[t.name] if isinstance(r, Mapping) else r for r in rows], t)
        for t in _specs(outputs)
    }


def encode_v1(rows: Sequence[Any], outputs: Specs, columnar: bool = False) -> dict[str, Any]:
    """TF-Serving's answer: ``{"predictions": [...]}`` for rows (each row an object by
    output name when the model has several), ``{"outputs": ...}`` for a columnar request."""
    specs = _specs(outputs)
    arrays = output_arrays(rows, specs)
    if columnar:
        return {"outputs": arrays if len(specs) > 1 else arrays[specs[0].name]}
    if len(specs) == 1:
        return {"predictions": arrays[specs[0].name]}
    return {"predictions": [{n: a[i] for n, a in arrays.items()} for i in range(len(rows))]}


def encode_v2(
    model: str,
    rows: Sequence[Any],
    request_id: str | None,
    outputs: Specs,
    wanted: Mapping[str, bool] | None = None,
    parameters: Mapping[str, Any] | None = None,
    version: str | None = None,
) -> dict[str, Any]:
    """The V2 response with every wanted output's data inline (and ``parameters``, e.g.
    the variant that served it), naming the ``version`` that served it as Triton does."""
    specs = [t for t in _specs(outputs) if wanted is None or t.name in wanted]
    body: dict[str, Any] = {"model_name": model, "outputs": []}
    if version is not None:
        body["model_version"] = version
    for t, arr in zip(specs, output_arrays(rows, specs).values(), strict=True):
        body["outputs"].append(
            {
                "name": t.name,
                "shape": list(arr.shape),
                "datatype": V2_TYPES.get(str(arr.dtype), "FP32"),
                "data": arr.ravel(),
            }
        )
    if request_id is not None:
        body["id"] = request_id
    if parameters:
        body["parameters"] = dict(parameters)
    return body


def encode_v2_binary(
    model: str,
    rows: Sequence[Any],
    request_id: str | None,
    outputs: Specs,
    wanted: Mapping[str, bool] | None = None,
    parameters: Mapping[str, Any] | None = None,
    version: str | None = None,
) -> tuple[bytes, int]:
    """The V2 response with the outputs wanted as binary data after the JSON object (in
    the order listed), the rest inline, and the length of that object.

    The length goes in the ``Inference-Header-Content-Length`` header.
    """
    body = encode_v2(model, rows, request_id, outputs, wanted, parameters, version)
    raw: list[bytes] = []
    for out in body["outputs"]:
        if wanted is None or wanted.get(out["name"], True):
            data = binary_tensors.encode(out.pop("data"), out["datatype"])
            out["parameters"] = {"binary_data_size": len(data)}
            raw.append(data)
    head = dump_json(body)
    return head + b"".join(raw), len(head)
