"""Client bodies: valid ones parse to the right tensor, every mistake is a 4xx with a reason."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson
import pytest

from bouncer.contract import TensorSpec
from bouncer.wire import dump_json
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
        ({"inputs": [_v2()["inputs"][0]] * 2}, 400, "takes 1 input tensor(s), got 2"),
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
    assert v2["model_name"] == "m" and v2["id"] == "req-1" and "model_version" not in v2
    assert encode_v2("m", outs, None, out, version="3")["model_version"] == "3"
    (o,) = v2["outputs"]
    assert o["shape"] == [2, 2] and o["datatype"] == "FP32" and len(o["data"]) == 4


def test_values_outside_the_dtype_range_are_refused() -> None:
    with pytest.raises(BadRequest, match="outside the range of float32"):
        parse_v1({"instances": [[[1e300, 0, 0], [0, 0, 0]]]}, S, 4)
    small = TensorSpec("input", "uint8", (1,))
    with pytest.raises(BadRequest, match="outside the range of uint8"):
        parse_v1({"instances": [[300]]}, small, 4)


TWO = (TensorSpec("tokens", "float32", (-1, 2)), TensorSpec("mask", "int64", (-1,)))


def test_v1_takes_several_inputs_as_rows_or_columns() -> None:
    rows = {"instances": [{"tokens": [[1, 2], [3, 4], [5, 6]], "mask": [1, 1, 0]}]}
    t = parse_v1(rows, TWO, max_batch=8)
    assert t.arrays["tokens"].shape == (1, 3, 2) and t.arrays["mask"].dtype == np.int64
    assert not t.columnar
    cols = {"inputs": {"tokens": [[[1, 2]], [[3, 4]]], "mask": [[1], [0]]}}
    t = parse_v1(cols, TWO, max_batch=8)
    assert t.n == 2 and t.columnar and t.arrays["mask"].tolist() == [[1], [0]]
    one = parse_v1({"inputs": [[ONE[0], ONE[1]]]}, S, max_batch=8)  # one input: its list
    assert one.columnar and one.array.shape == (1, 2, 3)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"instances": [{"tokens": [[1, 2]]}]}, "missing ['mask']"),
        ({"instances": [{"tokens": [[1, 2]], "mask": [1], "x": 1}]}, "unknown ['x']"),
        ({"instances": [[1, 2]]}, "each instance must be an object"),
        ({"inputs": {"tokens": [[[1, 2]]], "mask": [[1], [1]]}}, "disagree on the batch size"),
        ({"inputs": [[[1, 2]]]}, "must be an object by input name"),
        ({"instances": [], "inputs": {}}, "not both"),
    ],
)
def test_v1_several_inputs_mistakes(body: dict[str, Any], says: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(says)):
        parse_v1(body, TWO, max_batch=8)


def test_v2_takes_every_named_input_with_a_variable_dimension() -> None:
    body = {
        "inputs": [
            {"name": "mask", "shape": [2, 3], "datatype": "INT64", "data": [1, 1, 0, 1, 0, 0]},
            {"name": "tokens", "shape": [2, 3, 2], "datatype": "FP32", "data": list(range(12))},
        ]
    }
    t = parse_v2(body, TWO, max_batch=8)
    assert list(t.arrays) == ["tokens", "mask"]  # the model's order, whatever the request's
    assert t.arrays["tokens"].shape == (2, 3, 2) and t.input_name == "mask"
    short = {"inputs": [body["inputs"][1]]}
    with pytest.raises(BadRequest, match=re.escape("missing ['mask']")):
        parse_v2(short, TWO, max_batch=8)
    bad = {"inputs": [{**body["inputs"][0], "shape": [2, 3, 1], "data": [1] * 6}]}
    with pytest.raises(BadRequest, match="does not match the model input"):
        parse_v2({"inputs": [body["inputs"][1], *bad["inputs"]]}, TWO, max_batch=8)


def test_several_outputs_encode_by_name_in_each_protocol() -> None:
    outs = (TensorSpec("label", "int64", ()), TensorSpec("scores", "float32", (2,)))
    rows = [{"label": 1, "scores": [0.25, 0.75]}, {"label": 0, "scores": [0.5, 0.5]}]
    v1 = orjson.loads(dump_json(encode_v1(rows, outs)))
    assert v1 == {
        "predictions": [{"label": 1, "scores": [0.25, 0.75]}, {"label": 0, "scores": [0.5, 0.5]}]
    }
    cols = orjson.loads(dump_json(encode_v1(rows, outs, columnar=True)))
    assert cols == {"outputs": {"label": [1, 0], "scores": [[0.25, 0.75], [0.5, 0.5]]}}
    v2 = encode_v2("m", rows, None, outs, {"scores": False})
    (only,) = v2["outputs"]
    assert only["name"] == "scores" and only["shape"] == [2, 2] and only["datatype"] == "FP32"


def test_an_output_prints_the_same_whoever_served_it() -> None:
    """Lambda's outputs cross JSON as float64 text, an instance's as float32: the declared
    type makes both print alike."""
    out = TensorSpec("output", "float32", (1,))
    from_lambda = [[0.6297266483306885]]
    from_instance = [np.array([0.62972665], dtype=np.float32)]
    assert dump_json(encode_v1(from_lambda, out)) == dump_json(encode_v1(from_instance, out))
    assert dump_json(encode_v1(from_lambda, out)) == b'{"predictions":[[0.62972665]]}'
