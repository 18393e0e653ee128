"""The spill function's wire format: the event a runtime is handed and the reply it posts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from bouncer.contract import ModelContract
from mark.cloud.local.lambda_.records import Done
from mark.cloud.spill_event import spill_event
from mark.errors import PayloadTooLarge, SpillError, SpillRejected
from mark.ports import SPILL_PAYLOAD_LIMIT, SpillResult

PAYLOAD_LIMIT = SPILL_PAYLOAD_LIMIT  # as on AWS


def encode_event(
    model: str,
    instances: list[Any],
    source: str | ModelContract | None,
    dtype: str = "float32",
) -> bytes:
    """The event ``lambda_handlers.spill`` reads: ``{"model", "instances", "dtype",
    "contract"? | "source"?}``; the handler loads the model the contract describes (or
    the bare source) and decodes the rows as its input's type."""
    event = spill_event(model, instances, source, dtype)
    try:
        payload = json.dumps(event, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise SpillRejected(f"the batch for {model!r} is not JSON-serialisable: {exc}") from exc
    if len(payload) > PAYLOAD_LIMIT:
        raise PayloadTooLarge(
            f"event of {len(payload)} bytes is over Lambda's {PAYLOAD_LIMIT}-byte limit"
        )
    return payload


def decode_reply(model: str, done: Done, memory_mb: int) -> SpillResult:
    """The outputs of a finished invocation, or the ``SpillError`` its reply amounts to."""
    try:
        reply = json.loads(done.body)
    except ValueError:
        raise SpillError(f"the spill function's reply for {model!r} is not JSON") from None
    if not isinstance(reply, dict):
        raise SpillError(f"the spill function replied {type(reply).__name__}, not an object")
    if "error" in reply:
        raise SpillRejected(f"{model}: {reply['error']}")
    outputs = reply.get("outputs")
    if not isinstance(outputs, list):
        raise SpillError(f"the spill function's reply for {model!r} has no 'outputs' list")
    cold = done.cold or bool(reply.get("cold_start", False))
    return SpillResult(outputs, done.duration_ms, done.billed_ms, memory_mb, cold)


def absolute_source(source: str | ModelContract) -> str | ModelContract:
    """A model's artifact path made absolute, since the runtimes run in another directory."""
    if isinstance(source, ModelContract):
        return replace(source, artifact=str(absolute_source(source.artifact)))
    if (":" in source and not Path(source).exists()) or source.startswith("s3://"):
        return source  # pkg.mod:factory
    return str(Path(source).expanduser().resolve())


def plain(x: Any) -> Any:
    """Numpy arrays and tensors to lists, so a batch of either serialises as JSON."""
    tolist = getattr(x, "tolist", None)
    return tolist() if callable(tolist) else x
