"""What a client asks of a model's variants, and what it is told: a pinned variant and a
least accuracy, from the request's headers (both protocols) or a V2 request's
``parameters``; and the variant(s) that served the rows, for the response."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bouncer.wire import FLOOR_HEADER, VARIANT_HEADER
from mark.config import ModelSpec
from mark.serve.codec import BadRequest
from mark.serve.flight import Outcome

if TYPE_CHECKING:
    from mark.serve.dispatcher import Dispatcher

PIN_PARAMETER = "variant"
FLOOR_PARAMETER = "accuracy_floor"


def requested_variant(
    spec: ModelSpec, headers: Mapping[str, str], parameters: Mapping[str, Any] | None = None
) -> tuple[str | None, float]:
    """The variant a request pins (None: any) and the least accuracy it accepts (0: any),
    or ``BadRequest`` (400) naming what is wrong and what the model has."""
    params = parameters or {}
    pin = params.get(PIN_PARAMETER, headers.get(VARIANT_HEADER))
    floor_raw = params.get(FLOOR_PARAMETER, headers.get(FLOOR_HEADER))
    names = [v.name for v in spec.variants]
    if pin is not None:
        if not isinstance(pin, str) or not pin:
            raise BadRequest(400, f"the pinned variant must be a name, got {pin!r}")
        if pin not in names:
            has = f"its variants: {', '.join(names)}" if names else "it has no variants"
            raise BadRequest(400, f"model {spec.name!r} has no variant {pin!r} ({has})")
    floor = 0.0
    if floor_raw is not None:
        try:
            floor = float(floor_raw)
        except (TypeError, ValueError):
            raise BadRequest(
                400, f"the accuracy floor must be a number, got {floor_raw!r}"
            ) from None
        if not math.isfinite(floor) or not 0.0 < floor <= 1.0:
            raise BadRequest(400, f"the accuracy floor must be within (0, 1], got {floor_raw!r}")
        best = max((v.accuracy for v in spec.variants), default=None)
        if best is None:
            raise BadRequest(
                400, f"model {spec.name!r} has no variants with accuracies to hold to a floor"
            )
        if floor > best + 1e-12:
            raise BadRequest(
                400,
                f"no variant of {spec.name!r} reaches accuracy {floor:g} (the most accurate: "
                f"{best:g})",
            )
        if pin is not None and spec.variants:
            acc = next(v.accuracy for v in spec.variants if v.name == pin)
            if acc < floor - 1e-12:
                raise BadRequest(
                    400, f"variant {pin!r} has accuracy {acc:g}, below the floor {floor:g} asked"
                )
    return pin, floor


def variant_served(outcomes: Sequence[Outcome]) -> str | None:
    """The variant that served the rows, or the variants in row order, comma-separated,
    where they differ; None for a model without variants."""
    names = [o.variant for o in outcomes if o.variant is not None]
    if not names:
        return None
    return names[0] if len(set(names)) == 1 else ",".join(names)


def variant_headers(outcomes: Sequence[Outcome]) -> dict[str, str]:
    served = variant_served(outcomes)
    return {} if served is None else {VARIANT_HEADER: served}


def variant_metrics(model: str, dispatcher: Dispatcher) -> str:
    """Prometheus lines of a model with variants: the accuracy delivered over the SLO's
    period (this frontend's requests) beside its floor."""
    delivered = dispatcher.ledger.delivered(time.time())
    label = f'model="{model}"'
    lines = [f"mark_accuracy_floor{{{label}}} {dispatcher.accuracy_floor:g}"]
    if delivered is not None:
        lines.append(f"mark_accuracy_delivered{{{label}}} {delivered:.6f}")
    return "\n".join(lines) + "\n"
