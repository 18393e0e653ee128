"""The binary tensor data extension: raw tensors round-trip, and every malformed body is a 400."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from bouncer.contract import TensorSpec
from mark.serve.binary_tensors import decode, encode, split_body
from mark.serve.codec import (
    BadRequest,
    encode_v2_binary,
    parse_v2,
    parse_v2_outputs,
    split_v2,
)

S = TensorSpec("input", "float32", (2, 3))
OUT = TensorSpec("output", "float32", None)


@pytest.mark.parametrize(
    ("datatype", "arr"),
    [
        ("FP32", np.array([[0.5, -1.25, 3e38]], dtype=np.float32)),
        ("FP64", np.array([1e-300, 2.0], dtype=np.float64)),
        ("FP16", np.array([0.5, 65504.0], dtype=np.float16)),
        ("INT64", np.array([[-(2**63), 2**63 - 1, 0]], dtype=np.int64)),
        ("INT32", np.array([7, -7], dtype=np.int32)),
        ("UINT8", np.array([0, 255], dtype=np.uint8)),
        ("BOOL", np.array([True, False, True])),
    ],
)
def test_numeric_tensors_round_trip_little_endian(datatype: str, arr: np.ndarray[Any, Any]) -> None:
    raw = encode(arr, datatype)
    assert raw == arr.astype(arr.dtype.newbyteorder("<")).tobytes()  # the spec's layout
    back = decode(datatype, raw, arr.size)
    assert back.dtype == arr.dtype and np.array_equal(back, arr.ravel())


def test_bytes_tensors_match_the_reference_client() -> None:
    arr = np.array([b"", b"abc", "é".encode(), b"\x00\xff"], dtype=object)
    raw = encode(arr, "BYTES")
    assert raw == serialize_byte_tensor(arr).item()  # tritonclient's own serializer
    assert list(decode("BYTES", raw, 4)) == list(arr)
    assert list(deserialize_bytes_tensor(raw)) == list(arr)


@pytest.mark.parametrize(
    ("datatype", "raw", "count", "needle"),
    [
        ("FP32", b"\x00" * 7, 2, "7 bytes of binary data; 2 FP32 elements take 8"),
        ("INT64", b"\x00" * 9, 1, "take 8"),
        ("BOOL", b"\x00\x02", 2, "0 or 1"),
        ("BYTES", b"\x05\x00\x00\x00abc", 1, "claims 5 bytes; 3 are left"),
        ("BYTES", b"\x05\x00\x00\x00abcde\x01\x00", 2, "ends before element 1"),
        ("BYTES", b"\x00\x00\x00\x00zz", 1, "2 bytes are left"),
        ("BYTES", b"\x00" * 8, 10**12, "cannot hold"),
        ("COMPLEX", b"", 0, "unknown datatype"),
    ],
)
def test_malformed_binary_data_is_refused(
    datatype: str, raw: bytes, count: int, needle: str
) -> None:
    with pytest.raises(ValueError, match=needle):
        decode(datatype, raw, count)


def test_split_body_by_the_header_length() -> None:
    assert split_body(b'{"a": 1}xyz', "8") == (b'{"a": 1}', b"xyz")
    assert split_body(b'{"a": 1}', None) == (b'{"a": 1}', b"")
    for bad in ("", "-1", "1.5", "²", "99", "9" * 40):
        with pytest.raises(ValueError, match="Inference-Header-Content-Length"):
            split_body(b'{"a": 1}', bad)


ONE = np.arange(6, dtype=np.float32).reshape(1, 2, 3)


def _request(arr: np.ndarray[Any, Any], size: int | None = None, **extra: Any) -> tuple[bytes, str]:
    """A request body as tritonclient sends it with binary_data=True, and its header."""
    raw = arr.astype("<f4").tobytes()
    inp = {
        "name": "input",
        "shape": list(arr.shape),
        "datatype": "FP32",
        "parameters": {"binary_data_size": len(raw) if size is None else size},
    }
    head = orjson.dumps({"inputs": [{**inp, **extra}]})
    return head + raw, str(len(head))


def test_a_binary_request_parses_to_the_same_tensor_as_json() -> None:
    body, header = _request(np.concatenate([ONE, ONE + 1]))
    parsed, binary = split_v2(body, header)
    t = parse_v2(parsed, S, 8, binary)
    assert t.array.dtype == np.float32 and t.array.tolist() == [
        ONE[0].tolist(),
        (ONE + 1)[0].tolist(),
    ]


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda b, h: (b[:-4], h), '"binary_data_size" 24, but 20 bytes follow'),  # truncated
        (lambda b, h: (b + b"\x00", h), "1 bytes follow the JSON object that no input"),
        (lambda b, h: (b, str(int(h) + 100)), "the body has only"),
        (lambda b, h: (b, None), "not valid JSON"),  # binary data without the header
        (lambda b, h: (b, str(int(h) - 1)), "not valid JSON"),
    ],
)
def test_truncated_or_mislabelled_binary_bodies_are_400(mutate: Any, needle: str) -> None:
    body, header = mutate(*_request(ONE))
    with pytest.raises(BadRequest) as exc:
        parsed, binary = split_v2(body, header)
        parse_v2(parsed, S, 8, binary)
    assert exc.value.status == 400 and needle in exc.value.message


@pytest.mark.parametrize(
    ("arr", "extra", "needle"),
    [
        (ONE, {"data": [0] * 6}, 'both "data" and a "binary_data_size"'),
        (ONE, {"parameters": {"binary_data_size": "24"}}, "must be a byte count"),
        (ONE, {"parameters": {"binary_data_size": 24, "shared_memory_region": "r"}}, "shared"),
        (ONE, {"parameters": []}, "must be an object"),
        (ONE * np.float32(np.nan), {}, "NaN"),
        (np.zeros((1, 3, 2), np.float32), {}, "does not match the model input"),
    ],
)
def test_binary_input_mistakes(arr: np.ndarray[Any, Any], extra: Any, needle: str) -> None:
    body, header = _request(arr, **extra)
    parsed, binary = split_v2(body, header)
    with pytest.raises(BadRequest) as exc:
        parse_v2(parsed, S, 8, binary)
    assert exc.value.status == 400 and needle in exc.value.message


def test_bytes_after_a_json_only_request_are_refused() -> None:
    head = orjson.dumps(
        {
            "inputs": [
                {"name": "input", "shape": [1, 2, 3], "datatype": "FP32", "data": list(range(6))}
            ]
        }
    )
    parsed, binary = split_v2(head + b"junk", str(len(head)))
    with pytest.raises(BadRequest, match="that no input's"):
        parse_v2(parsed, S, 8, binary)


@pytest.mark.parametrize(
    ("body", "binary"),
    [
        ({}, False),
        ({"parameters": {"binary_data_output": True}}, True),
        ({"outputs": [{"name": "output", "parameters": {"binary_data": True}}]}, True),
        (
            {
                "outputs": [{"name": "output", "parameters": {"binary_data": False}}],
                "parameters": {"binary_data_output": True},
            },
            False,
        ),
        ({"outputs": [{"name": "output"}], "parameters": {"binary_data_output": True}}, True),
        ({"outputs": []}, False),
    ],
)
def test_which_outputs_come_back_binary(body: dict[str, Any], binary: bool) -> None:
    assert parse_v2_outputs(body, OUT) == {"output": binary}


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"outputs": [{"name": "probs"}]}, "unknown output 'probs'"),
        ({"outputs": "output"}, "must be a list"),
        ({"outputs": [{"name": "output", "parameters": {"classification": 3}}]}, "classification"),
        ({"outputs": [{"name": "output", "parameters": {"binary_data": 1}}]}, "true or false"),
        ({"parameters": {"binary_data_output": "yes"}}, "true or false"),
    ],
)
def test_requested_output_mistakes(body: dict[str, Any], needle: str) -> None:
    with pytest.raises(BadRequest, match=needle):
        parse_v2_outputs(body, OUT)


def test_a_binary_response_is_json_then_raw_output() -> None:
    outs = [[0.1, 0.9], [0.8, 0.2]]
    body, n = encode_v2_binary("m", outs, "req-1", TensorSpec("output", "float32", None))
    head = orjson.loads(body[:n])
    (o,) = head["outputs"]
    assert head["id"] == "req-1" and "data" not in o
    assert o == {
        "name": "output",
        "shape": [2, 2],
        "datatype": "FP32",
        "parameters": {"binary_data_size": 16},
    }
    assert np.array_equal(decode("FP32", body[n:], 4), np.asarray(outs, dtype=np.float32).ravel())


def test_several_binary_inputs_read_their_bytes_in_order_and_outputs_choose_binary() -> None:
    specs = (TensorSpec("a", "float32", (2,)), TensorSpec("b", "int64", (-1,)))
    a = np.array([[1.5, 2.5]], dtype=np.float32)
    b = np.array([[7, 8, 9]], dtype=np.int64)
    a_bin: dict[str, Any] = {
        "name": "a",
        "shape": [1, 2],
        "datatype": "FP32",
        "parameters": {"binary_data_size": 8},
    }
    head = {
        "inputs": [
            a_bin,
            {"name": "b", "shape": [1, 3], "datatype": "INT64", "data": [7, 8, 9]},
        ]
    }
    t = parse_v2(head, specs, 8, a.tobytes())
    assert t.arrays["a"].tolist() == a.tolist() and t.arrays["b"].tolist() == b.tolist()
    both = {
        "inputs": [
            a_bin,
            {
                "name": "b",
                "shape": [1, 3],
                "datatype": "INT64",
                "parameters": {"binary_data_size": 24},
            },
        ]
    }
    t = parse_v2(both, specs, 8, a.tobytes() + b.tobytes())
    assert t.arrays["b"].tolist() == [[7, 8, 9]]
    outs = (TensorSpec("x", "float32", (2,)), TensorSpec("y", "int64", ()))
    rows = [{"x": [0.5, 1.0], "y": 3}]
    body, n = encode_v2_binary("m", rows, None, outs, {"x": True, "y": False})
    obj = orjson.loads(body[:n])
    x, y = obj["outputs"]
    assert x["parameters"] == {"binary_data_size": 8} and "data" not in x
    assert y["data"] == [3] and "parameters" not in y
    assert np.frombuffer(body[n:], dtype="<f4").tolist() == [0.5, 1.0]
