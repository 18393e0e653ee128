"""Client bodies: valid ones parse to the right tensor, every mistake is a 4xx with a reason."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bouncer.contract import TensorSpec
from mark.serve.codec import BadRequest, encode_v1, encode_v2, parse_json, parse_v1, parse_v2

S = TensorSpec("input", "float32", (2, 3))
ONE = [[0, 1, 2], [3, 4, 5]]


def test_v1_parses_instances_to_a_batch() -> None:
    t = parse_v1({"instances": [ONE, ONE]}, S, max_batch=8)
    assert t.array.shape == (2, 2, 3) and t.array.dtype == np.float32 and t.n == 2


def test_v2_parses_flat_data_with_its_shape() -> None:
    body = {
        "inputs": [
            {"name": "input", "shape": [1, 2, 3], "datatype": "FP32", "data": list(range(6))}
        ]
    }
    t = parse_v2(body, S, max_batch=8)
    assert t.array.tolist() == [ONE] and t.input_name == "input"
    nested = {"inputs": [{"name": "input", "shape": [1, 2, 3], "datatype": "FP32", "data": [ONE]}]}
    assert parse_v2(nested, S, 8).array.tolist() == [ONE]


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ([1, 2], 400, "JSON object"),
        ({}, 400, 'missing field "instances"'),
        ({"instances": "abc"}, 400, "must be a list"),
        ({"instances": []}, 400, "empty"),
        ({"instances": [[[0, 1], [2, 3]]]}, 400, "instance shape [2, 2], the model expects [2, 3]"),
        ({"instances": [ONE, [[1]]]}, 400, "rectangular"),
        ({"instances": [[["a", "b", "c"], ["d", "e", "f"]]]}, 400, "numbers"),
        ({"instances": [[[float("nan"), 1, 2], [3, 4, 5]]]}, 400, "NaN"),
        ({"instances": [ONE] * 9}, 413, "limit is 8"),
    ],
)
def test_v1_mistakes(body: Any, status: int, needle: str) -> None:
    with pytest.raises(BadRequest) as exc:
        parse_v1(body, S, max_batch=8)
    assert exc.value.status == status and needle in exc.value.message


def _v2(**over: Any) -> dict[str, Any]:
    inp = {"name": "input", "shape": [1, 2, 3], "datatype": "FP32", "data": list(range(6))}
    inp.update(over)
    return {"inputs": [inp]}


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"inputs": []}, 400, '"inputs"'),
        ({"inputs": [1]}, 400, "must be an object"),
        ({"inputs": [{"name": "x"}]}, 400, 'missing field "shape"'),
        (_v2(datatype="INT64"), 400, "the model takes 'FP32'"),
        (_v2(shape=[1, 3, 2]), 400, "does not match the model input [-1, 2, 3]"),
        (_v2(shape="1,2,3"), 400, "list of non-negative integers"),
        (_v2(data=list(range(5))), 400, "has 5 values; shape [1, 2, 3] needs 6"),
        (_v2(shape=[9, 2, 3], data=list(range(54))), 413, "limit is 8"),
        (_v2(shape=[0, 2, 3], data=[]), 400, "empty"),
        ({"inputs": [_v2()["inputs"][0]] * 2}, 400, "exactly 1 input"),
    ],
)
def test_v2_mistakes(body: Any, status: int, needle: str) -> None:
    with pytest.raises(BadRequest) as exc:
        parse_v2(body, S, max_batch=8)
    assert exc.value.status == status and needle in exc.value.message


def test_integer_models_refuse_fractions() -> None:
    s = TensorSpec("input", "int64", (2,))
    assert parse_v1({"instances": [[1.0, 2.0]]}, s, 4).array.dtype == np.int64
    with pytest.raises(BadRequest, match="integers"):
        parse_v1({"instances": [[1.5, 2.0]]}, s, 4)


def test_bad_json_is_400() -> None:
    with pytest.raises(BadRequest, match="not valid JSON"):
        parse_json(b"{nope")
    with pytest.raises(BadRequest):
        parse_json(b"\xff\xfe")


def test_encoders_produce_each_protocols_shape() -> None:
    outs = [np.array([0.1, 0.9], dtype=np.float32), np.array([0.8, 0.2], dtype=np.float32)]
    out = TensorSpec("output", "float32", None)
    v1 = encode_v1(outs, out)
    assert np.allclose(v1["predictions"], [[0.1, 0.9], [0.8, 0.2]])
    v2 = encode_v2("m", outs, "req-1", out)
    assert v2["model_name"] == "m" and v2["id"] == "req-1"
    (o,) = v2["outputs"]
    assert o["shape"] == [2, 2] and o["datatype"] == "FP32" and len(o["data"]) == 4


def test_values_outside_the_dtype_range_are_refused() -> None:
    with pytest.raises(BadRequest, match="outside the range of float32"):
        parse_v1({"instances": [[[1e300, 0, 0], [0, 0, 0]]]}, S, 4)
    small = TensorSpec("input", "uint8", (1,))
    with pytest.raises(BadRequest, match="outside the range of uint8"):
        parse_v1({"instances": [[300]]}, small, 4)
