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

The routes are in ``mark.serve.models_routes`` (health, readiness, metadata) and
``mark.serve.inference`` (predict, infer); their shared state in ``mark.serve.api_state``;
where bodies are parsed in ``mark.serve.parsing``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from importlib import metadata

from aiohttp import web

from mark.config import Settings
from mark.logs import request_ids
from mark.serve.access_log import access_log
from mark.serve.api_state import (
    RETRY_AFTER_S,
    STATE,
    ApiState,
    Handler,
    Served,
    error_response,
    json_response,
)
from mark.serve.auth import AUTH, INFERENCE, METRICS, Auth, KeyCache, require_key
from mark.serve.body import BodyTimeout, hang_up
from mark.serve.codec import BadRequest
from mark.serve.inference import MAX_INSTANCES_PER_REQUEST, infer_v2, predict_v1
from mark.serve.intake import Intake
from mark.serve.model_routes import (
    list_models,
    live,
    model_metadata,
    model_ready,
    model_status_v1,
    ready,
    server_metadata,
)
from mark.serve.openapi import openapi_document
from mark.serve.parsing import Parsing
from mark.serve.variant_choice import variant_metrics

__all__ = ["MAX_INSTANCES_PER_REQUEST", "STATE", "ApiState", "Parsing", "Served", "build_app"]

log = logging.getLogger("mark.api")


def _version() -> str:
    try:
        return metadata.version("mark")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadRequest as exc:  # ClientGone too: the client left, not a 5xx nor an ERROR
        response = error_response(exc.status, exc.message)
        return await hang_up(request, response) if isinstance(exc, BodyTimeout) else response
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[STATE].settings.api.max_body_bytes
        return error_response(413, f"request body too large: the limit is {limit} bytes")
    except web.HTTPException as exc:
        if exc.status >= 400:
            return error_response(exc.status, exc.reason)
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal error; the daemon logged it")


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    text = "".join(s.telemetry.prometheus() for s in state.models.values() if s.telemetry)
    text += "".join(
        variant_metrics(s.spec.name, s.dispatcher)
        for s in state.models.values()
        if s.dispatcher is not None and s.dispatcher.variants
    )
    if state.more_metrics is not None:
        text += state.more_metrics()
    if AUTH in request.app:
        text += request.app[AUTH].prometheus()
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def openapi(request: web.Request) -> web.Response:
    """The document of the models served now (a repository read again may have changed
    them since start)."""
    state = request.app[STATE]
    models = tuple(s.spec for s in state.models.values())
    return json_response(openapi_document(state.settings.model_copy(update={"models": models})))


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
        return json_response({"error": intake.refusal}, 503, {"Retry-After": RETRY_AFTER_S})
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
    # The daemon's own dict, not a copy: a model added or removed while it runs is seen.
    served = (
        (models if isinstance(models, dict) else dict(models))
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
