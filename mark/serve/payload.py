"""Whether a request's rows can go to the spill function at all.

Lambda's synchronous Invoke takes at most 6 MB of request (``SPILL_PAYLOAD_LIMIT``),
and mark spills one row per invocation. A row whose event is larger could be served
by an instance but never spilled: it would fail exactly when the fleet is busy, the
moment a client can least diagnose. So such a request is refused up front with 413,
the same answer whatever the fleet is doing. Spilling through S3 instead (the event
names an object) would lift the limit at the price of a PUT and a GET per spilled
row; a body limit (``api.max_body_bytes``, 8 MiB) already bounds what comes in, so
refusing what cannot spill keeps one simple path.

The bound is cheap first (elements times the longest JSON text of their type) and
exact only when that bound is over the limit.
"""

from __future__ import annotations

import math

import numpy as np

from bouncer.wire import dump_json
from mark.serve.codec import BadRequest, Tensor

JSON_CHARS = {
    "float16": 11,
    "float32": 16,
    "float64": 25,
    "int8": 5,
    "int16": 7,
    "int32": 12,
    "int64": 21,
    "uint8": 4,
    "bool": 6,
}
"""The longest decimal text of one element, with its separator (``-1.1754944e-38,``)."""
ENVELOPE_BYTES = 64 * 1024
"""The rest of an event: the model's name, its contract, the dtype, JSON's brackets."""


def row_bound(tensor: Tensor) -> int:
    """An upper bound on one row's JSON text, in bytes."""
    return sum(
        math.prod(a.shape[1:]) * JSON_CHARS.get(str(a.dtype), 25) for a in tensor.arrays.values()
    )


def refuse_unspillable(tensor: Tensor, limit: int, model: str) -> None:
    """413 if a row of ``tensor`` makes a spill event over ``limit`` bytes."""
    if row_bound(tensor) + ENVELOPE_BYTES <= limit:
        return
    largest = max(
        len(dump_json({n: np.ascontiguousarray(a[i]) for n, a in tensor.arrays.items()}))
        for i in range(tensor.n)
    )
    if largest + ENVELOPE_BYTES > limit:
        raise BadRequest(
            413,
            f"one instance of {model!r} is {largest:,} bytes as JSON, and Lambda takes at most "
            f"{limit - ENVELOPE_BYTES:,} per spilled instance: mark could not spill it when "
            "the instances are busy; send smaller instances (split or downsample them)",
        )
