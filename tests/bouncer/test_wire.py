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
