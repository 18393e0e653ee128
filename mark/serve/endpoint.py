"""The aiohttp application clients call: TF-Serving V1 and Open Inference Protocol V2.

Handlers parse and validate (``mark.serve.codec``), hand rows to the model's
dispatcher, and encode the outcomes. A middleware turns anything unexpected
into a JSON 500 *and logs it*; client mistakes never get that far.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from aiohttp import web

from bouncer.wire import SERVED_BY_HEADER, dump_json
from mark.config import ModelSpec, Settings
from mark.serve.codec import (
    V2_TYPES,
    BadRequest,
    Tensor,
    encode_v1,
    encode_v2,
    parse_json,
    parse_v1,
    parse_v2,
)
from mark.serve.dispatcher import Dispatcher, Outcome
from mark.serve.openapi import openapi_document
from mark.serve.telemetry import Telemetry

log = logging.getLogger("mark.api")

MAX_INSTANCES_PER_REQUEST = 1024


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


STATE: web.AppKey[ApiState] = web.AppKey("mark_api", ApiState)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(
    body: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=dump_json(body), status=status, content_type="application/json", headers=headers
    )


def _served_by(outcomes: list[Outcome]) -> dict[str, str]:
    """Which instance(s) or Lambda answered: for clients, load generators and debugging."""
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
    return served


async def live(_: web.Request) -> web.Response:
    return _json({"live": True})


async def ready(request: web.Request) -> web.Response:
    ok = request.app[STATE].is_ready()
    return _json({"ready": ok}, 200 if ok else 503)


async def list_models(request: web.Request) -> web.Response:
    return _json({"models": sorted(request.app[STATE].models)})


async def model_metadata(request: web.Request) -> web.Response:
    m = _served(request).spec
    return _json(
        {
            "name": m.name,
            "platform": "pytorch_torchscript" if m.loader == "torchscript" else "pytorch",
            "inputs": [
                {
                    "name": "input",
                    "datatype": V2_TYPES[m.input.dtype],
                    "shape": [-1, *m.input.shape],
                }
            ],
            "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, -1]}],
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
        encode_v1([o.output for o in outcomes]), headers=_served_by(outcomes)
    )


async def infer_v2(request: web.Request) -> web.Response:
    served = _served(request)
    body = parse_json(await request.read())
    tensor = parse_v2(body, served.spec.input, MAX_INSTANCES_PER_REQUEST)
    outcomes = await _run(served, tensor)
    req_id = body.get("id") if isinstance(body.get("id"), str) else None
    return _failure(outcomes) or _json(
        encode_v2(served.spec.name, [o.output for o in outcomes], req_id),
        headers=_served_by(outcomes),
    )


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    text = "".join(s.telemetry.prometheus() for s in state.models.values() if s.telemetry)
    if state.more_metrics is not None:
        text += state.more_metrics()
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def openapi(request: web.Request) -> web.Response:
    return _json(openapi_document(request.app[STATE].settings))


def build_app(
    settings: Settings,
    models: Mapping[str, Served] | None = None,
    is_ready: Callable[[], bool] = lambda: True,
) -> web.Application:
    app = web.Application(client_max_size=settings.api.max_body_bytes, middlewares=[errors_as_json])
    served = (
        dict(models)
        if models is not None
        else {m.name: Served(m, None, None) for m in settings.models}
    )
    app[STATE] = ApiState(settings, served, is_ready)
    app.add_routes(
        [
            web.get("/v2/health/live", live),
            web.get("/v2/health/ready", ready),
            web.get("/v1/models", list_models),
            web.get("/v2/models/{name}", model_metadata),
            web.post("/v2/models/{name}/infer", infer_v2),
            web.post(r"/v1/models/{name}:predict", predict_v1),
            web.get("/metrics", metrics),
            web.get("/openapi.json", openapi),
        ]
    )
    return app
