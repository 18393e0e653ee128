"""The spill function's event, as both Lambda adapters (local and AWS) build it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from bouncer.contract import ModelContract

Source = str | ModelContract
"""What tells the function its model: a contract, or a bare source (a path or factory)."""


def spill_event(
    model: str, instances: Sequence[Any], source: Source | None, dtype: str = "float32"
) -> dict[str, Any]:
    """``{"model", "instances", "dtype", "contract"? | "source"?}``, as
    ``lambda_handlers.spill`` reads it; with neither, the deployed function knows its
    model from its environment."""
    event: dict[str, Any] = {"model": model, "instances": list(instances), "dtype": dtype}
    if isinstance(source, ModelContract):
        event["contract"] = json.loads(source.to_json())
    elif source is not None:
        event["source"] = source
    return event
