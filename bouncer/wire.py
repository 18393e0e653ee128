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

A line may be far longer than aiohttp's ``readline`` allows (its read buffer's
high-water mark, some hundreds of KiB; a batch of images' outputs is megabytes),
so the dispatcher reads the answer with ``LineReader``. The decoders raise
``ValueError`` on any malformed line, an empty one (the answer ended early)
included, so the dispatcher has one failure to handle.

``SERVED_BY_HEADER`` is the response header with which the frontend tells a
client who answered: instance ids, or ``lambda``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np
import orjson

from bouncer.contract import DTYPES as CONTRACT_DTYPES
from bouncer.latency import BatchLatency


def _tolist(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic):
        return obj.tolist()
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def dump_json(body: Any) -> bytes:
    """``body`` as compact JSON bytes."""
    return orjson.dumps(body, default=_tolist, option=orjson.OPT_SERIALIZE_NUMPY)


SERVED_BY_HEADER = "X-Mark-Served-By"
VARIANT_HEADER = "X-Mark-Variant"
"""On a batch offered to an agent: the variant to run it on (none: the model's own). On a
client's request: the variant it pins. On a response: the variants that served its rows,
in row order, comma-separated where they differ (``bouncer.variants``)."""
FALLBACK_HEADER = "X-Mark-Variant-Fallback"
"""On a batch offered to an agent: a faster variant the frontend's accuracy floor allows
it to run the batch on instead, if its Bouncer finds the named one would finish it past
the batch's earliest deadline (the frontend's view of the queue is a moment old)."""
FLOOR_HEADER = "X-Mark-Accuracy-Floor"
"""On a client's request: the least accuracy a variant must have to serve it."""
"""Who answered a prediction: instance ids (comma-separated if several), or "lambda"."""

BATCH_PATH = "/v1/batch"
JSON_TYPE = "application/json"
NDJSON_TYPE = "application/x-ndjson"
DTYPES = frozenset(CONTRACT_DTYPES)
"""The element types a batch may carry."""


def encode_batch(instances: Any, dtype: str, deadlines: Sequence[float]) -> bytes:
    """The body of a batch offered to an agent."""
    return dump_json({"instances": instances, "dtype": dtype, "deadlines": list(deadlines)})


Batch = np.ndarray[Any, Any] | dict[str, np.ndarray[Any, Any]]
"""A batch as the agent runs it: the one input's array, or each named input's."""


def batch_size(batch: Batch) -> int:
    first = next(iter(batch.values())) if isinstance(batch, dict) else batch
    return int(first.shape[0])


def take(batch: Batch, rows: Sequence[int]) -> Batch:
    """The batch's rows ``rows``, in that order."""
    if isinstance(batch, dict):
        return {name: a[list(rows)] for name, a in batch.items()}
    return batch[list(rows)]


def decode_batch(raw: bytes, dtypes: Mapping[str, str] | None = None) -> tuple[Batch, list[float]]:
    """A batch body as the agent reads it: the instances as one array (or, when each is
    an object by input name, one array per input, of ``dtypes[name]``), and their
    deadlines.

    Raises ``ValueError``, ``KeyError``, ``TypeError`` or ``AttributeError`` on a bad body.
    """
    body = orjson.loads(raw)
    if not isinstance(body, dict):
        raise TypeError("the body must be a JSON object")
    instances = body["instances"]
    deadlines = [float(d) for d in body["deadlines"]]
    batch: Batch
    if isinstance(instances, list) and instances and isinstance(instances[0], dict):
        names = list(dtypes) if dtypes is not None else list(instances[0])
        batch = {
            n: np.asarray([i[n] for i in instances], dtype=(dtypes or {}).get(n)) for n in names
        }
    else:
        dtype = body.get("dtype", "float32")
        if dtype not in DTYPES:
            raise ValueError(f"unsupported dtype {dtype!r}")
        batch = np.asarray(instances, dtype=dtype)
        if batch.ndim < 1:
            raise ValueError("the instances must be a list")
    if not deadlines or len(deadlines) != batch_size(batch):
        raise ValueError("need one deadline per instance and at least one instance")
    return batch, deadlines


class Verdict(NamedTuple):
    """The first line of an agent's answer: what its Bouncer admitted, and when it finishes."""

    admitted: list[int]
    rejected: list[int]
    finish: float
    variant: str | None = None
    """The variant the batch runs on, where the agent has variants."""


MAX_LINE_BYTES = 512 * 1024 * 1024
"""The longest line ``LineReader`` takes: far above any real batch's outputs, so only a
runaway agent fails its batch, instead of the daemon running out of memory."""


class Chunks(Protocol):
    """A body read in pieces as they arrive (aiohttp's ``StreamReader``)."""

    async def readany(self) -> bytes: ...


class LineReader:
    """The lines of a streamed answer, each of any length up to ``limit``.

    aiohttp's ``readline`` raises ``LineTooLong`` past its buffer's high-water
    mark and copies the line so far on every chunk (quadratic in its length);
    this keeps what follows a line for the next one and joins in linear time.
    """

    def __init__(self, body: Chunks, limit: int = MAX_LINE_BYTES) -> None:
        self._body = body
        self._limit = limit
        self._buf = bytearray()

    async def line(self) -> bytes:
        """The next line with its newline; at the end of the body, what is left (``b""``
        when nothing is). Raises ``ValueError`` past ``limit`` bytes."""
        searched = 0
        while True:
            end = self._buf.find(b"\n", searched)
            if end >= 0:
                line = bytes(self._buf[: end + 1])
                del self._buf[: end + 1]
                return line
            if len(self._buf) > self._limit:
                raise ValueError(f"a line of the answer exceeds {self._limit} bytes")
            searched = len(self._buf)
            chunk = await self._body.readany()
            if not chunk:
                line = bytes(self._buf)
                self._buf.clear()
                return line
            self._buf += chunk


def encode_verdict(
    admitted: Sequence[int], rejected: Sequence[int], finish: float, variant: str | None = None
) -> bytes:
    head: dict[str, Any] = {
        "admitted": list(admitted),
        "rejected": list(rejected),
        "finish": finish,
    }
    if variant is not None:
        head["variant"] = variant
    return dump_json(head) + b"\n"


def _object(line: bytes, what: str) -> dict[str, Any]:
    if not line.strip():
        raise ValueError(f"the answer ended before its {what} line")
    body = orjson.loads(line)  # JSONDecodeError is a ValueError
    if not isinstance(body, dict):
        raise ValueError(f"the {what} line is not a JSON object")
    return body


def decode_verdict(line: bytes, size: int | None = None) -> Verdict:
    """The first line. With the batch's ``size``, every index must name one of its
    requests, once. Raises ``ValueError`` on a malformed line."""
    head = _object(line, "verdict")
    try:
        verdict = Verdict(
            [int(i) for i in head["admitted"]],
            [int(i) for i in head["rejected"]],
            float(head["finish"]),
            str(head["variant"]) if head.get("variant") is not None else None,
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"bad verdict line: {type(exc).__name__}: {exc}") from exc
    if not math.isfinite(verdict.finish):
        raise ValueError(f"the verdict's finish is {verdict.finish}")
    if size is not None:
        named = verdict.admitted + verdict.rejected
        if len(set(named)) != len(named) or any(not 0 <= i < size for i in named):
            raise ValueError(f"the verdict names requests outside a batch of {size} or twice")
    return verdict


def encode_outputs(outputs: Any) -> bytes:
    """The second line of an answer: the admitted requests' outputs, in order."""
    return dump_json({"outputs": outputs}) + b"\n"


def encode_error(message: str) -> bytes:
    """The second line of an answer when the batch failed."""
    return dump_json({"error": message}) + b"\n"


def decode_result(line: bytes, count: int | None = None) -> tuple[Any, str | None]:
    """The second line: ``(outputs, None)``, or ``(None, error)``. With ``count``, the
    outputs must be a list of that many. Raises ``ValueError`` on a malformed line."""
    tail = _object(line, "result")
    if "error" in tail:
        return None, str(tail["error"])
    if "outputs" not in tail:
        raise ValueError("the result line has neither outputs nor an error")
    outputs = tail["outputs"]
    if count is not None and (not isinstance(outputs, list) or len(outputs) != count):
        got = len(outputs) if isinstance(outputs, list) else type(outputs).__name__
        raise ValueError(f"the result line has {got} outputs for {count} admitted requests")
    return outputs, None


def health_variants(body: Mapping[str, Any]) -> dict[str, BatchLatency]:
    """The batch latency of each variant an agent loaded beside the model's own, from its
    ``/health`` body (``variants``: name to ``[[b, seconds], ...]``); empty for none."""
    raw = body.get("variants") or {}
    return {
        str(name): BatchLatency.from_mapping({int(b): float(t) for b, t in points})
        for name, points in raw.items()
    }
