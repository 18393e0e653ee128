"""One JSON encoder for every hop: arrays written directly, the odd ones via tolist."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bouncer.wire import dump_json


def test_arrays_of_every_layout_round_trip() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    for arr in (a, a.T, a.astype(np.float16), a.astype(np.int64)[:, ::2]):
        assert json.loads(dump_json({"x": arr})) == {"x": arr.tolist()}
    assert json.loads(dump_json([np.float32(0.5), np.int64(3)])) == [0.5, 3]


def test_what_json_cannot_hold_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        dump_json({"x": object()})


def test_the_agent_protocol_round_trips() -> None:
    from bouncer.wire import (
        SERVED_BY_HEADER,
        Verdict,
        decode_batch,
        decode_result,
        decode_verdict,
        encode_batch,
        encode_error,
        encode_outputs,
        encode_verdict,
    )

    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    batch, deadlines = decode_batch(encode_batch(rows, "float32", [1.0, 2.0, 3.0]))
    assert isinstance(batch, np.ndarray)
    assert batch.dtype == np.float32 and np.array_equal(batch, rows) and deadlines == [1, 2, 3]
    for bad in (b"[]", b'{"instances": [[1]], "deadlines": [1, 2]}', b'{"instances": [1]}'):
        with pytest.raises((ValueError, KeyError, TypeError)):
            decode_batch(bad)
    head = encode_verdict((0, 2), (1,), 12.5)
    assert head.endswith(b"\n") and decode_verdict(head) == Verdict([0, 2], [1], 12.5)
    ran = decode_verdict(encode_verdict((0,), (), 1.0, "small"))
    assert ran == Verdict([0], [], 1.0, "small")  # the variant the batch ran on
    assert decode_result(encode_outputs(rows[:2])) == ([[0.0, 1.0], [2.0, 3.0]], None)
    assert decode_result(encode_error("boom")) == (None, "boom")
    assert SERVED_BY_HEADER == "X-Mark-Served-By"  # clients read it: a public name
    named = [{"ids": np.array([1, 2]), "w": np.array([0.5])}, {"ids": [3, 4], "w": [1.5]}]
    batch, _ = decode_batch(
        encode_batch(named, "float32", [1.0, 2.0]), {"ids": "int64", "w": "float16"}
    )
    assert isinstance(batch, dict) and batch["ids"].dtype == np.int64
    assert batch["w"].dtype == np.float16 and batch["ids"].tolist() == [[1, 2], [3, 4]]
