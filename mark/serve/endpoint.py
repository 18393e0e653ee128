"""The aiohttp application clients call: TF-Serving V1 and Open Inference Protocol V2.

Handlers parse and validate (``mark.serve.codec``), hand rows to the model's
dispatcher, and encode the outcomes. A middleware turns anything unexpected
into a JSON 500 *and logs it*; client mistakes never get that far.

V2 as Triton's reference clients speak it: server metadata (``GET /v2``), model
readiness, the binary tensor data extension both ways, and every model route
also under ``/versions/{v}`` for the version served (a model directory's highest, or the
one its manifest names). A model is
ready while a request has somewhere to go: an instance, or the spill function.
TF-Serving's model status (``GET /v1/models/{name}``) says the same in V1 terms.

Every route but the health checks needs an API key with the scope ``ROUTE_SCOPES``
names (``mark.serve.auth``: 401 without a valid key, 403 without the scope, 429
over the key's limits); which instance served a request is told to admin keys only.

Readiness (``/v2/health/ready``, and each model's) follows ``mark.serve.intake``:
false until the daemon's first agent sync, and false again from the moment it
drains; meanwhile inference requests get 503 with ``Retry-After`` at once.

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

import asyncio
import functools
import logging
import multiprocessing
import os
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, ParamSpec, TypeVar

from aiohttp import web

from bouncer.contract import TensorSpec
from bouncer.wire import SERVED_BY_HEADER, dump_json
from mark.config import ModelSpec, Settings
from mark.logs import request_ids
from mark.serve.access_log import access_log
from mark.serve.auth import AUTH, INFERENCE, METRICS, Auth, KeyCache, require_key, sees_internals
from mark.serve.binary_tensors import HEADER_LENGTH, OCTET_STREAM
from mark.serve.body import BodyTimeout, hang_up, read_body
from mark.serve.codec import (
    V2_TYPES,
    BadRequest,
    Tensor,
    encode_v1,
    encode_v2,
    encode_v2_binary,
    read_v1,
    read_v2,
)
from mark.serve.dispatcher import Dispatcher, Outcome
from mark.serve.intake import Intake, Phase
from mark.serve.openapi import openapi_document
from mark.serve.telemetry import Telemetry

log = logging.getLogger("mark.api")

MAX_INSTANCES_PER_REQUEST = 1024
EXTENSIONS = ["binary_tensor_data"]
"""The V2 protocol extensions implemented, as server metadata lists them."""
RETRY_AFTER_S = "1"
"""``Retry-After`` on a 503: a retry soon may find an instance free, the daemon ready,
or (draining) another replica behind the load balancer."""
LISTED_ROWS = 10
"""At most this many failed rows are named in an error."""


INLINE_BODY_BYTES = 64 * 1024
"""Bodies up to this size are parsed on the event loop; larger ones in a parser process.

Parsing costs about 10 ms per MiB (orjson, then numpy's list-to-array), so 64 KiB
stalls the loop that runs every model's batcher for under a millisecond, while a
parser process round trip costs about as much. Threads would not do: orjson and
numpy hold the GIL for the whole parse (a 9 MiB body stalled the loop 60 ms from a
thread, 100 ms inline, 6 ms from a process: ``tests/mark/serve/loop_lag.py``)."""
PARSER_PROCESSES = 2
"""At most this many parser processes, however many big bodies arrive: a flood queues
(each body already bounded by ``api.max_body_bytes``) instead of forking without end."""
PARSE_QUEUE = 16
"""At most this many big bodies waiting for or in a parser process; the next one is
refused (503, ``Retry-After``) instead of held: 16 bodies of 8 MiB are 128 MiB held
(and again as pickles) and about a second of parsing on two processes."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass
class Parsing:
    """Where request bodies are parsed: small ones inline, big ones in a bounded process
    pool (started on the first big body, so a daemon never sent one pays nothing)."""

    inline_bytes: int = INLINE_BODY_BYTES
    processes: int = PARSER_PROCESSES
    max_queued: int = PARSE_QUEUE
    _pool: ProcessPoolExecutor | None = field(default=None, repr=False)
    _queued: int = field(default=0, repr=False)

    async def run(self, size: int, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """``fn(*args)``, off the event loop when ``size`` is over ``inline_bytes``;
        its exceptions (``BadRequest``) are raised here either way. A parser process that
        died (killed for memory, say) fails the requests it had with a 503 and the next
        big body gets a new pool, instead of every later one failing on a broken pool."""
        if size <= self.inline_bytes:
            return fn(*args, **kwargs)
        if self._queued >= self.max_queued:
            raise BadRequest(
                503, f"{self._queued} large request bodies are being parsed already; retry"
            )
        self._queued += 1
        try:
            return await self._in_pool(fn, *args, **kwargs)
        finally:
            self._queued -= 1

    async def _in_pool(self, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if self._pool is None:
            # forkserver, not fork: the daemon has threads, and a forked child would
            # inherit their locks; the server forks workers from a clean process.
            ctx = multiprocessing.get_context(
                "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
            )
            self._pool = ProcessPoolExecutor(
                max_workers=max(1, min(self.processes, os.cpu_count() or 1)), mp_context=ctx
            )
        pool = self._pool
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(pool, functools.partial(fn, *args, **kwargs))
        except BrokenProcessPool:
            log.error("a request parser process died; a new pool starts with the next big body")
            if self._pool is pool:
                self.close()
            raise BadRequest(503, "the request parser failed; retry") from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _version() -> str:
    try:
        return metadata.version("mark")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@dataclass
class Served:
    """What the API needs of one model."""

    spec: ModelSpec
    dispatcher: Dispatcher | None
    telemetry: Telemetry | None


@dataclass
class ApiState:
    settings: Settings
    models: dict[str, Served]
    intake: Intake
    """Whether inference requests are taken (starting, open, draining) and how many are
    not answered yet."""
    more_metrics: Callable[[], str] | None = None
    """The control loop's counters, once it runs (spend-rail hits, forecast clips)."""
    version: str = "0+unknown"
    """mark's own version, as server metadata reports it."""
    parsing: Parsing = field(default_factory=Parsing)
    """Where request bodies are parsed (big ones off the event loop)."""


STATE: web.AppKey[ApiState] = web.AppKey("mark_api", ApiState)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(
    body: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=dump_json(body), status=status, content_type="application/json", headers=headers
    )


def _served_by(request: web.Request, outcomes: list[Outcome]) -> dict[str, str]:
    """Which instance(s) or Lambda answered, for admin keys (load generators, debugging):
    instance ids are the fleet's internals, not every client's business."""
    if not sees_internals(request):
        return {}
    who = (
        outcomes[0].served_by
        if len(outcomes) == 1
        else ",".join(sorted({o.served_by for o in outcomes}))
    )
    return {SERVED_BY_HEADER: who}


def _error(status: int, message: str) -> web.Response:
    """The error as JSON; a 503 (busy, or shutting down) says when to retry."""
    return _json(
        {"error": message}, status, {"Retry-After": RETRY_AFTER_S} if status == 503 else None
    )


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadRequest as exc:  # ClientGone too: the client left, not a 5xx nor an ERROR
        response = _error(exc.status, exc.message)
        return await hang_up(request, response) if isinstance(exc, BodyTimeout) else response
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[STATE].settings.api.max_body_bytes
        return _error(413, f"request body too large: the limit is {limit} bytes")
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _error(exc.status, exc.reason)
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _error(500, "internal error; the daemon logged it")


def _served(request: web.Request) -> Served:
    name = request.match_info["name"]
    served = request.app[STATE].models.get(name)
    if served is None:
        raise BadRequest(404, f"unknown model {name!r}; GET /v1/models lists them")
    version = request.match_info.get("version", served.spec.version)
    if version != served.spec.version:
        raise BadRequest(
            404,
            f"model {name!r} has no version {version!r}; mark serves version {served.spec.version}",
        )
    return served


def _can_serve(state: ApiState, served: Served) -> bool:
    """Whether the model is ready: the endpoint serves, and a request for it has an
    instance or the spill function."""
    return state.intake.ready and served.dispatcher is not None and served.dispatcher.can_serve


_NOT_SERVABLE = "no instance and no spill function can serve it now"


def _not_ready(state: ApiState) -> str:
    return state.intake.refusal or _NOT_SERVABLE


async def live(_: web.Request) -> web.Response:
    return _json({"live": True})


async def ready(request: web.Request) -> web.Response:
    """200 while the endpoint serves; 503 while it starts (its instances not synced yet)
    and from the moment it drains, so a load balancer sends it nothing then."""
    ok = request.app[STATE].intake.ready
    return _json({"ready": ok}, 200 if ok else 503)


async def server_metadata(request: web.Request) -> web.Response:
    return _json({"name": "mark", "version": request.app[STATE].version, "extensions": EXTENSIONS})


async def model_ready(request: web.Request) -> web.Response:
    """200 when ready; otherwise 400, as the V2 protocol (and Triton) answer "false"."""
    served = _served(request)
    state = request.app[STATE]
    if _can_serve(state, served):
        return _json({"name": served.spec.name, "ready": True})
    return _json({"name": served.spec.name, "ready": False, "error": _not_ready(state)}, 400)


async def list_models(request: web.Request) -> web.Response:
    return _json({"models": sorted(request.app[STATE].models)})


async def model_status_v1(request: web.Request) -> web.Response:
    """TF-Serving's model status: version 1 is AVAILABLE while ready, else LOADING.

    TF-Serving's states are UNKNOWN, START, LOADING, AVAILABLE, UNLOADING and END;
    a model waiting for capacity (or for the daemon's first agent sync) is LOADING, one
    of a draining daemon UNLOADING, with error code UNAVAILABLE saying why.
    """
    served = _served(request)
    state = request.app[STATE]
    ok = _can_serve(state, served)
    draining = state.intake.phase is Phase.DRAINING
    status = {
        "version": served.spec.version,
        "state": "AVAILABLE" if ok else "UNLOADING" if draining else "LOADING",
        "status": {
            "error_code": "OK" if ok else "UNAVAILABLE",
            "error_message": "" if ok else _not_ready(state),
        },
    }
    return _json({"model_version_status": [status]})


PLATFORMS = {
    "torchscript": "pytorch_libtorch",
    "onnx": "onnxruntime_onnx",
    "python": "python",
    "pytorch": "pytorch",
}
"""Each format as Triton's model metadata names its platform."""


def _tensor_metadata(t: TensorSpec) -> dict[str, Any]:
    return {"name": t.name, "datatype": V2_TYPES[t.dtype], "shape": t.batch_shape()}


async def model_metadata(request: web.Request) -> web.Response:
    """V2 model metadata: the real tensors, ``-1`` for the batch and each variable
    dimension (an output's whole instance shape too if it was never declared or learnt)."""
    m = _served(request).spec
    return _json(
        {
            "name": m.name,
            "versions": [m.version],
            "platform": PLATFORMS[m.model_format],
            "inputs": [_tensor_metadata(t.spec()) for t in m.inputs],
            "outputs": [_tensor_metadata(t.spec()) for t in m.outputs],
            "slo": {"rt_max_ms": m.slo.rt_max_ms, "sl_min": m.slo.sl_min},
        }
    )


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


async def _run(state: ApiState, served: Served, tensor: Tensor) -> Ran:
    dispatcher = served.dispatcher
    if dispatcher is None:
        raise BadRequest(503, "no serving capacity for this model yet")
    outcomes = await dispatcher.submit(tensor.array)
    again = _retryable(outcomes)
    if not again or dispatcher.serverless is None or not state.intake.ready:
        return Ran(outcomes)
    log.info(
        "%s: %d of %d rows failed; retried on the spill function",
        served.spec.name,
        len(again),
        len(outcomes),
    )
    retried = await dispatcher.submit(tensor.array[again], spill_now=True)
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
    return _json({"error": message}, 503, {"Retry-After": RETRY_AFTER_S})


async def predict_v1(request: web.Request) -> web.Response:
    served = _served(request)
    state = request.app[STATE]
    body = await read_body(request, state.settings.api.body_read_timeout_s)
    spec = served.spec
    schema = spec.input_tensor
    tensor = await state.parsing.run(len(body), read_v1, body, schema, MAX_INSTANCES_PER_REQUEST)
    ran = await _run(state, served, tensor)
    outcomes = ran.outcomes
    return _failure(ran) or _json(
        encode_v1([o.output for o in outcomes], spec.output_tensor),
        headers=_served_by(request, outcomes),
    )


async def infer_v2(request: web.Request) -> web.Response:
    served = _served(request)
    state = request.app[STATE]
    body = await read_body(request, state.settings.api.body_read_timeout_s)
    given_length = request.headers.get(HEADER_LENGTH)
    spec = served.spec
    schema = spec.input_tensor
    parsed = await state.parsing.run(
        len(body),
        read_v2,
        body,
        given_length,
        schema,
        MAX_INSTANCES_PER_REQUEST,
        spec.output_tensor.name,
    )
    ran = await _run(state, served, parsed.tensor)
    failure = _failure(ran)
    if failure is not None:
        return failure
    outcomes = ran.outcomes
    req_id = parsed.request_id
    outputs = [o.output for o in outcomes]
    if not parsed.binary_output:
        served_by = _served_by(request, outcomes)
        body_v2 = encode_v2(spec.name, outputs, req_id, spec.output_tensor)
        return _json(body_v2, headers=served_by)
    payload, head_length = encode_v2_binary(spec.name, outputs, req_id, spec.output_tensor)
    return web.Response(
        body=payload,
        content_type=OCTET_STREAM,
        headers={**_served_by(request, outcomes), HEADER_LENGTH: str(head_length)},
    )


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    text = "".join(s.telemetry.prometheus() for s in state.models.values() if s.telemetry)
    if state.more_metrics is not None:
        text += state.more_metrics()
    if AUTH in request.app:
        text += request.app[AUTH].prometheus()
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def openapi(request: web.Request) -> web.Response:
    return _json(openapi_document(request.app[STATE].settings))


ROUTE_SCOPES: dict[Handler, str | None] = {live: None, ready: None, metrics: METRICS}
"""The scope each handler needs; None: open to load balancers. Every other route (and an
unknown path or method) needs ``inference``."""


INFERENCE_HANDLERS: frozenset[Handler] = frozenset({predict_v1, infer_v2})
"""The routes the intake guards: refused outside ``open``, counted until answered."""


def _needs(request: web.Request) -> str | None:
    return ROUTE_SCOPES.get(request.match_info.handler, INFERENCE)


@web.middleware
async def intake_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Inference while starting or draining: 503 with ``Retry-After`` at once (before the
    key is checked, so a refusal costs the key nothing). Otherwise the request is taken
    and counted until its handler returns its answer."""
    if request.match_info.handler not in INFERENCE_HANDLERS:
        return await handler(request)
    intake = request.app[STATE].intake
    if not intake.take():
        return _json({"error": intake.refusal}, 503, {"Retry-After": RETRY_AFTER_S})
    try:
        return await handler(request)
    finally:
        intake.done()


def build_app(
    settings: Settings,
    models: Mapping[str, Served] | None = None,
    keys: KeyCache | None = None,
    intake: Intake | None = None,
) -> web.Application:
    """The endpoint; with ``api.auth`` (the default) it answers only ``keys`` (none given:
    no key is valid, so only the health checks answer). ``intake`` (none given: open)
    is how the daemon holds inference until its first agent sync and drains it."""
    auth = [require_key] if settings.api.auth else []
    # request_ids outermost: every log line of a request, and its answer, names it.
    # access_log inside it (the id) and outside errors_as_json (the status answered).
    middlewares = [request_ids, access_log(settings), errors_as_json, intake_guard, *auth]
    app = web.Application(client_max_size=settings.api.max_body_bytes, middlewares=middlewares)
    if settings.api.auth:
        app[AUTH] = Auth(keys if keys is not None else KeyCache(), settings.api, _needs)
    served = (
        dict(models)
        if models is not None
        else {m.name: Served(m, None, None) for m in settings.models}
    )
    state = ApiState(
        settings, served, intake if intake is not None else Intake(), version=_version()
    )
    app[STATE] = state

    async def close_parsing(_: web.Application) -> None:
        state.parsing.close()

    app.on_cleanup.append(close_parsing)
    v2_model = "/v2/models/{name}"
    v2_version = "/v2/models/{name}/versions/{version}"
    # A model name has no ':', so GET .../{name}:predict stays a 405, not an unknown model.
    v1_model = "/v1/models/{name:[^/:]+}"
    app.add_routes(
        [
            web.get("/v2", server_metadata),
            web.get("/v2/health/live", live),
            web.get("/v2/health/ready", ready),
            web.get("/v1/models", list_models),
            web.get(v1_model, model_status_v1),
            web.get(v1_model + "/versions/{version}", model_status_v1),
            web.post(r"/v1/models/{name}:predict", predict_v1),
            web.post(r"/v1/models/{name}/versions/{version}:predict", predict_v1),
            *(
                route
                for prefix in (v2_model, v2_version)
                for route in (
                    web.get(prefix, model_metadata),
                    web.get(prefix + "/ready", model_ready),
                    web.post(prefix + "/infer", infer_v2),
                )
            ),
            web.get("/metrics", metrics),
            web.get("/openapi.json", openapi),
        ]
    )
    return app
