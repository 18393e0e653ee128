"""The inference routes: TF-Serving V1 predict and V2 infer.

Handlers parse and validate (``mark.serve.codec``, big bodies in a parser process),
hand the rows to the model's dispatcher, and encode the outcomes.

A request of several rows whose rows partly fail. Neither the Open Inference
Protocol (an inference response is its outputs, or ``{"error"}`` with an error
status) nor TF-Serving's predict (``{"predictions"}`` or ``{"error"}``) has an
answer with per-row errors: the batch dimension belongs to the tensor, so a
request succeeds or fails as a whole. Rows fail separately here only because
the dispatcher splits a request over batches, instances and spill chunks, and
such a partial failure is local to one executor (an agent's batch error, one
failed invocation). So the rows that failed, and only those, are retried once on
the spill function, keeping the rows that succeeded; if every row succeeds then,
the answer is 200. Otherwise, or when every row failed (then the cause is the
input, the model or an outage, and the client's own retry is the right loop, not
a doubled load on a failing spill function), the answer is 503 with
``Retry-After`` naming the rows that failed. Not retried: rows nobody ran (no
capacity, declined by the SLO's miss budget, the give-up backstop, shutting down) and
anything while draining. A
retry is one more spill invocation, so an answer comes within the dispatcher's
``outcome_bound_s`` plus its spill timeout.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiohttp import web

from mark.ports import SPILL_PAYLOAD_LIMIT
from mark.serve.api_state import (
    RETRY_AFTER_S,
    STATE,
    ApiState,
    Served,
    json_response,
    served_by,
    served_model,
)
from mark.serve.binary_tensors import HEADER_LENGTH, OCTET_STREAM
from mark.serve.body import read_body
from mark.serve.codec import (
    BadRequest,
    Tensor,
    encode_v1,
    encode_v2,
    encode_v2_binary,
    read_v1,
    read_v2,
)
from mark.serve.dispatcher import Outcome
from mark.serve.payload import refuse_unspillable
from mark.serve.variant_choice import requested_variant, variant_headers, variant_served

log = logging.getLogger("mark.api")

MAX_INSTANCES_PER_REQUEST = 1024
LISTED_ROWS = 10
"""At most this many failed rows are named in an error."""


@dataclass(frozen=True)
class Ran:
    """A request's rows run: one outcome per row, and whether failed rows were retried."""

    outcomes: list[Outcome]
    retried: bool = False


def _retryable(outcomes: list[Outcome]) -> list[int]:
    """The rows to retry once on the spill function: those an instance or the spill
    function failed, when other rows of the request succeeded (module docstring)."""
    if all(not o.ok for o in outcomes):
        return []
    return [i for i, o in enumerate(outcomes) if not o.ok and o.served_by != "none"]


async def _run(
    state: ApiState, served: Served, tensor: Tensor, pin: str | None = None, floor: float = 0.0
) -> Ran:
    dispatcher = served.dispatcher
    if dispatcher is None:
        raise BadRequest(503, "no serving capacity for this model yet")
    if dispatcher.serverless is not None:
        refuse_unspillable(tensor, SPILL_PAYLOAD_LIMIT, served.spec.name)
    # One tensor each way travels as the bare array (the agent protocol's original form,
    # and the cheapest); several travel by name.
    single = len(tensor.arrays) == 1 and len(served.spec.outputs) == 1
    outcomes = await dispatcher.submit(
        tensor.array if single else tensor.arrays, pin=pin, floor=floor
    )
    again = _retryable(outcomes)
    if not again or dispatcher.serverless is None or not state.intake.ready:
        return Ran(outcomes)
    log.info(
        "%s: %d of %d rows failed; retried on the spill function",
        served.spec.name,
        len(again),
        len(outcomes),
    )
    retry = {name: a[again] for name, a in tensor.arrays.items()}
    retried = await dispatcher.submit(
        tensor.array[again] if single else retry, spill_now=True, pin=pin, floor=floor
    )
    for i, outcome in zip(again, retried, strict=True):
        outcomes[i] = outcome
    return Ran(outcomes, retried=True)


def _failure(ran: Ran) -> web.Response | None:
    """503 with ``Retry-After`` naming the rows that failed, if any did."""
    outcomes = ran.outcomes
    failed = [i for i, o in enumerate(outcomes) if not o.ok]
    if not failed:
        return None
    rows = ", ".join(str(i) for i in failed[:LISTED_ROWS])
    if len(failed) > LISTED_ROWS:
        rows += ", ..."
    retried = " (retried once on the spill function)" if ran.retried else ""
    error = outcomes[failed[0]].error
    message = f"{len(failed)} of {len(outcomes)} instances failed{retried}, rows {rows}: {error}"
    return json_response({"error": message}, 503, {"Retry-After": RETRY_AFTER_S})


async def predict_v1(request: web.Request) -> web.Response:
    served = served_model(request)
    state = request.app[STATE]
    body = await read_body(request, state.settings.api.body_read_timeout_s)
    spec = served.spec
    inputs = spec.input_specs
    pin, floor = requested_variant(spec, request.headers)
    tensor = await state.parsing.run(len(body), read_v1, body, inputs, MAX_INSTANCES_PER_REQUEST)
    ran = await _run(state, served, tensor, pin, floor)
    failure = _failure(ran)
    if failure is not None:
        return failure
    outcomes = ran.outcomes
    answer = encode_v1([o.output for o in outcomes], spec.output_specs, tensor.columnar)
    variant = variant_served(outcomes)
    if variant is not None:
        answer["variant"] = variant
    return json_response(
        answer, headers={**served_by(request, outcomes), **variant_headers(outcomes)}
    )


async def infer_v2(request: web.Request) -> web.Response:
    served = served_model(request)
    state = request.app[STATE]
    body = await read_body(request, state.settings.api.body_read_timeout_s)
    given_length = request.headers.get(HEADER_LENGTH)
    spec = served.spec
    parsed = await state.parsing.run(
        len(body),
        read_v2,
        body,
        given_length,
        spec.input_specs,
        MAX_INSTANCES_PER_REQUEST,
        spec.output_specs,
    )
    pin, floor = requested_variant(spec, request.headers, parsed.parameters)
    ran = await _run(state, served, parsed.tensor, pin, floor)
    failure = _failure(ran)
    if failure is not None:
        return failure
    outcomes = ran.outcomes
    req_id = parsed.request_id
    outputs = [o.output for o in outcomes]
    who = {**served_by(request, outcomes), **variant_headers(outcomes)}
    variant = variant_served(outcomes)
    params = {"variant": variant} if variant is not None else None
    if not parsed.binary_output:
        body_v2 = encode_v2(
            spec.name, outputs, req_id, spec.output_specs, parsed.outputs, params, spec.version
        )
        return json_response(body_v2, headers=who)
    payload, head_length = encode_v2_binary(
        spec.name, outputs, req_id, spec.output_specs, parsed.outputs, params, spec.version
    )
    return web.Response(
        body=payload,
        content_type=OCTET_STREAM,
        headers={**who, HEADER_LENGTH: str(head_length)},
    )
