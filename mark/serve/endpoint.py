"""The aiohttp application clients call: TF-Serving V1 and Open Inference Protocol V2.

Handlers parse and validate (``mark.serve.codec``), hand rows to the model's
dispatcher, and encode the outcomes. A middleware turns anything unexpected
into a JSON 500 *and logs it*; client mistakes never get that far.

V2 as Triton's reference clients speak it: server metadata (``GET /v2``), model
readiness, the binary tensor data extension both ways, and every model route
also under ``/versions/1`` (mark serves one version of each model). A model is
ready while a request has somewhere to go: an instance, or the spill function.
TF-Serving's model status (``GET /v1/models/{name}``) says the same in V1 terms.

Every route but the health checks needs an API key with the scope ``ROUTE_SCOPES``
names (``mark.serve.auth``: 401 without a valid key, 403 without the scope, 429
over the key's limits); which instance served a request is told to admin keys only.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from importlib import metadata

from aiohttp import web

from bouncer.wire import SERVED_BY_HEADER, dump_json
from mark.config import ModelSpec, Settings
from mark.serve.auth import AUTH, INFERENCE, METRICS, Auth, KeyCache, require_key, sees_internals
from mark.serve.binary_tensors import HEADER_LENGTH, OCTET_STREAM
from mark.serve.codec import (
    OUTPUT_NAME,
    V2_TYPES,
    BadRequest,
    Tensor,
    encode_v1,
    encode_v2,
    encode_v2_binary,
    parse_json,
    parse_v1,
    parse_v2,
    parse_v2_outputs,
    split_v2,
)
from mark.serve.dispatcher import Dispatcher, Outcome
from mark.serve.openapi import openapi_document
from mark.serve.telemetry import Telemetry

log = logging.getLogger("mark.api")

MAX_INSTANCES_PER_REQUEST = 1024
MODEL_VERSION = "1"
"""The one version of each model mark serves, as V2 and TF-Serving name it."""
EXTENSIONS = ["binary_tensor_data"]
"""The V2 protocol extensions implemented, as server metadata lists them."""


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
    is_ready: Callable[[], bool]
    more_metrics: Callable[[], str] | None = None
    """The control loop's counters, once it runs (spend-rail hits, forecast clips)."""
    version: str = "0+unknown"
    """mark's own version, as server metadata reports it."""


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
    return _json({"error": message}, status)


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadRequest as exc:
        return _error(exc.status, exc.message)
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
    version = request.match_info.get("version", MODEL_VERSION)
    if version != MODEL_VERSION:
        raise BadRequest(
            404, f"model {name!r} has no version {version!r}; mark serves version {MODEL_VERSION}"
        )
    return served


def _can_serve(state: ApiState, served: Served) -> bool:
    """Whether the model is ready: a request for it has an instance or the spill function."""
    return state.is_ready() and served.dispatcher is not None and served.dispatcher.can_serve


_NOT_SERVABLE = "no instance and no spill function can serve it now"


async def live(_: web.Request) -> web.Response:
    return _json({"live": True})


async def ready(request: web.Request) -> web.Response:
    ok = request.app[STATE].is_ready()
    return _json({"ready": ok}, 200 if ok else 503)


async def server_metadata(request: web.Request) -> web.Response:
    return _json({"name": "mark", "version": request.app[STATE].version, "extensions": EXTENSIONS})


async def model_ready(request: web.Request) -> web.Response:
    """200 when ready; otherwise 400, as the V2 protocol (and Triton) answer "false"."""
    served = _served(request)
    if _can_serve(request.app[STATE], served):
        return _json({"name": served.spec.name, "ready": True})
    return _json({"name": served.spec.name, "ready": False, "error": _NOT_SERVABLE}, 400)


async def list_models(request: web.Request) -> web.Response:
    return _json({"models": sorted(request.app[STATE].models)})


async def model_status_v1(request: web.Request) -> web.Response:
    """TF-Serving's model status: version 1 is AVAILABLE while ready, else LOADING.

    TF-Serving's states are UNKNOWN, START, LOADING, AVAILABLE, UNLOADING and END;
    a model waiting for capacity is LOADING, with error code UNAVAILABLE saying why.
    """
    served = _served(request)
    ok = _can_serve(request.app[STATE], served)
    status = {
        "version": MODEL_VERSION,
        "state": "AVAILABLE" if ok else "LOADING",
        "status": {
            "error_code": "OK" if ok else "UNAVAILABLE",
            "error_message": "" if ok else _NOT_SERVABLE,
        },
    }
    return _json({"model_version_status": [status]})


async def model_metadata(request: web.Request) -> web.Response:
    m = _served(request).spec
    return _json(
        {
            "name": m.name,
            "versions": [MODEL_VERSION],
            "platform": "pytorch_torchscript" if m.loader == "torchscript" else "pytorch",
            "inputs": [
                {
                    "name": "input",
                    "datatype": V2_TYPES[m.input.dtype],
                    "shape": [-1, *m.input.shape],
                }
            ],
            "outputs": [{"name": OUTPUT_NAME, "datatype": "FP32", "shape": [-1, -1]}],
            "slo": {"rt_max_ms": m.slo.rt_max_ms, "sl_min": m.slo.sl_min},
        }
    )


async def _run(served: Served, tensor: Tensor) -> list[Outcome]:
    if served.dispatcher is None:
        raise BadRequest(503, "no serving capacity for this model yet")
    return await served.dispatcher.submit(tensor.array)


def _failure(outcomes: list[Outcome]) -> web.Response | None:
    failed = [o for o in outcomes if not o.ok]
    if not failed:
        return None
    return _error(503, f"{len(failed)} of {len(outcomes)} instances failed: {failed[0].error}")


async def predict_v1(request: web.Request) -> web.Response:
    served = _served(request)
    body = parse_json(await request.read())
    tensor = parse_v1(body, served.spec.input, MAX_INSTANCES_PER_REQUEST)
    outcomes = await _run(served, tensor)
    return _failure(outcomes) or _json(
        encode_v1([o.output for o in outcomes]), headers=_served_by(request, outcomes)
    )


async def infer_v2(request: web.Request) -> web.Response:
    served = _served(request)
    body, binary = split_v2(await request.read(), request.headers.get(HEADER_LENGTH))
    tensor = parse_v2(body, served.spec.input, MAX_INSTANCES_PER_REQUEST, binary)
    binary_output = parse_v2_outputs(body)
    outcomes = await _run(served, tensor)
    failure = _failure(outcomes)
    if failure is not None:
        return failure
    req_id = body.get("id") if isinstance(body.get("id"), str) else None
    outputs = [o.output for o in outcomes]
    if not binary_output:
        served_by = _served_by(request, outcomes)
        return _json(encode_v2(served.spec.name, outputs, req_id), headers=served_by)
    payload, head_length = encode_v2_binary(served.spec.name, outputs, req_id)
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


def _needs(request: web.Request) -> str | None:
    return ROUTE_SCOPES.get(request.match_info.handler, INFERENCE)


def build_app(
    settings: Settings,
    models: Mapping[str, Served] | None = None,
    is_ready: Callable[[], bool] = lambda: True,
    keys: KeyCache | None = None,
) -> web.Application:
    """The endpoint; with ``api.auth`` (the default) it answers only ``keys`` (none given:
    no key is valid, so only the health checks answer)."""
    middlewares = [errors_as_json, *([require_key] if settings.api.auth else [])]
    app = web.Application(client_max_size=settings.api.max_body_bytes, middlewares=middlewares)
    if settings.api.auth:
        app[AUTH] = Auth(keys if keys is not None else KeyCache(), settings.api, _needs)
    served = (
        dict(models)
        if models is not None
        else {m.name: Served(m, None, None) for m in settings.models}
    )
    app[STATE] = ApiState(settings, served, is_ready, version=_version())
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
