"""What the endpoint's handlers share: each model's dispatcher and telemetry (``Served``,
made by ``model_request_path``), the app's state, and the few helpers every route answers with."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from bouncer.miss_budget import MissBudget
from bouncer.wire import SERVED_BY_HEADER, dump_json
from mark.config import ModelSpec, Settings
from mark.identity import frontend_id
from mark.ports import Serverless
from mark.profile_files import spill_batches
from mark.serve.auth import sees_internals
from mark.serve.codec import BadRequest
from mark.serve.dispatcher import Dispatcher, Outcome
from mark.serve.intake import Intake
from mark.serve.parsing import Parsing
from mark.serve.telemetry import Telemetry

RETRY_AFTER_S = "1"
"""``Retry-After`` on a 503: a retry soon may find an instance free, the daemon ready,
or (draining) another replica behind the load balancer."""


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


def json_response(
    body: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=dump_json(body),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def served_by(request: web.Request, outcomes: list[Outcome]) -> dict[str, str]:
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


def error_response(status: int, message: str) -> web.Response:
    """The error as JSON; a 503 (busy, or shutting down) says when to retry."""
    return json_response(
        {"error": message}, status, {"Retry-After": RETRY_AFTER_S} if status == 503 else None
    )


def served_model(request: web.Request) -> Served:
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


def can_serve(state: ApiState, served: Served) -> bool:
    """Whether the model is ready: the endpoint serves, and a request for it has an
    instance or the spill function."""
    return state.intake.ready and served.dispatcher is not None and served.dispatcher.can_serve


NOT_SERVABLE = "no instance and no spill function can serve it now"


def not_ready(state: ApiState) -> str:
    return state.intake.refusal or NOT_SERVABLE


def model_request_path(
    settings: Settings,
    m: ModelSpec,
    clock: Callable[[], float],
    session: aiohttp.ClientSession,
    serverless: Serverless | None,
) -> Served:
    """One model's request path: its telemetry and its started dispatcher."""
    tel = Telemetry(
        m.name,
        m.slo.rt_max_ms,
        settings.timings.sample_window_s,
        recent_size=settings.slo_monitor.last_m,
        started_at=clock(),
        source=frontend_id(),
    )
    # Declines off too: its tally is what a pool sized for rises may still leave to miss
    # (provisioner.rise_headroom.rise_allowance).
    budget = (
        MissBudget(m.slo.sl_min, m.slo.decline_share, window_s=m.slo.period_s)
        if serverless is not None
        else None
    )
    disp = Dispatcher(
        m.name,
        m.slo.rt_max_ms / 1000.0,
        m.input_tensor.dtype,
        clock,
        session,
        serverless,
        tel,
        budget=budget,
        spill_batches=spill_batches(m.profile, m.name, settings.spill_memory_mb),
        variants=[(v.name, v.accuracy) for v in m.variants],
        accuracy_floor=m.accuracy_floor,
        accuracy_window_s=m.slo.period_s,
    )
    disp.start()
    return Served(m, disp, tel)
