"""The wire: JSON as the frontend, the agents and clients exchange it, and the agent protocol.

One encoder for every hop (``dump_json``), so arrays never take a ``tolist``
detour on the request path; what orjson cannot write natively (a
non-contiguous or float16 array, a numpy scalar it does not know) falls back
to ``tolist``.

The agent protocol, spoken by the dispatcher (``mark.serve.dispatcher``) and
the agent (``bouncer.agent``) through the functions below: ``POST
BATCH_PATH`` with ``{"instances": [...], "dtype": "float32", "deadlines":
[...]}`` (deadlines are absolute Unix times); the answer is two JSON lines,
streamed (``NDJSON_TYPE``):

1. at once, the admission: ``{"admitted": [i, ...], "rejected": [j, ...], "finish": t}``;
2. when the batch has run, ``{"outputs": [...]}`` for the admitted ones, in
   order, or ``{"error": "..."}``.

``SERVED_BY_HEADER`` is the response header with which the frontend tells a
client who answered: instance ids, or ``lambda``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import orjson


def _tolist(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic):
        return obj.tolist()
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def dump_json(body: Any) -> bytes:
    """``body`` as compact JSON bytes."""
    return orjson.dumps(body, default=_tolist, option=orjson.OPT_SERIALIZE_NUMPY)


SERVED_BY_HEADER = "X-Mark-Served-By"
"""Who answered a prediction: instance ids (comma-separated if several), or "lambda"."""

BATCH_PATH = "/v1/batch"
JSON_TYPE = "application/json"
NDJSON_TYPE = "application/x-ndjson"
DTYPES = frozenset({"float32", "float64", "int64", "int32", "uint8", "bool"})
"""The element types a batch may carry."""


def encode_batch(instances: Any, dtype: str, deadlines: Sequence[float]) -> bytes:
    """The body of a batch offered to an agent."""
    return dump_json({"instances": instances, "dtype": dtype, "deadlines": list(deadlines)})


def decode_batch(raw: bytes) -> tuple[np.ndarray[Any, Any], list[float]]:
    """A batch body as the agent reads it: the instances as one array, and their deadlines.

    Raises ``ValueError``, ``KeyError``, ``TypeError`` or ``AttributeError`` on a bad body.
    """
    body = orjson.loads(raw)
    if not isinstance(body, dict):
        raise TypeError("the body must be a JSON object")
    dtype = body.get("dtype", "float32")
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}")
    batch = np.asarray(body["instances"], dtype=dtype)
    deadlines = [float(d) for d in body["deadlines"]]
    if batch.ndim < 1 or len(deadlines) != batch.shape[0] or not deadlines:
        raise ValueError("need one deadline per instance and at least one instance")
    return batch, deadlines


class Verdict(NamedTuple):
    """The first line of an agent's answer: what its Bouncer admitted, and when it finishes."""

    admitted: list[int]
    rejected: list[int]
    finish: float


def encode_verdict(admitted: Sequence[int], rejected: Sequence[int], finish: float) -> bytes:
    return (
        dump_json({"admitted": list(admitted), "rejected": list(rejected), "finish": finish})
        + b"\n"
    )


def decode_verdict(line: bytes) -> Verdict:
    head = orjson.loads(line)
    return Verdict(
        [int(i) for i in head["admitted"]],
        [int(i) for i in head["rejected"]],
        float(head["finish"]),
    )


def encode_outputs(outputs: Any) -> bytes:
    """The second line of an answer: the admitted requests' outputs, in order."""
    return dump_json({"outputs": outputs}) + b"\n"


def encode_error(message: str) -> bytes:
    """The second line of an answer when the batch failed."""
    return dump_json({"error": message}) + b"\n"


def decode_result(line: bytes) -> tuple[Any, str | None]:
    """The second line: ``(outputs, None)``, or ``(None, error)``."""
    tail = orjson.loads(line)
    if "error" in tail:
        return None, str(tail["error"])
    return tail["outputs"], None
