"""The aiohttp application: health, model metadata and (with the data plane) inference.

Until the data plane lands, inference answers 503 with a JSON body that says so;
health and metadata are already the KServe V2 shapes clients expect.
"""

from __future__ import annotations

from aiohttp import web

from mark.config import ModelSpec, Settings

SETTINGS: web.AppKey[Settings] = web.AppKey("settings", Settings)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _model_or_404(request: web.Request) -> ModelSpec | web.Response:
    name = request.match_info["name"]
    for m in request.app[SETTINGS].models:
        if m.name == name:
            return m
    return _error(404, f"unknown model {name!r}")


async def live(_: web.Request) -> web.Response:
    return web.json_response({"live": True})


async def ready(_: web.Request) -> web.Response:
    return web.json_response({"ready": True})


async def list_models(request: web.Request) -> web.Response:
    return web.json_response({"models": [m.name for m in request.app[SETTINGS].models]})


async def model_metadata(request: web.Request) -> web.Response:
    m = _model_or_404(request)
    if isinstance(m, web.Response):
        return m
    return web.json_response(
        {
            "name": m.name,
            "platform": "pytorch_torchscript" if m.loader == "torchscript" else "pytorch",
            "inputs": [
                {"name": "input", "datatype": m.input.dtype.upper(), "shape": [-1, *m.input.shape]}
            ],
            "slo": {"rt_max_ms": m.slo.rt_max_ms, "sl_min": m.slo.sl_min},
        }
    )


async def predict(request: web.Request) -> web.Response:
    m = _model_or_404(request)
    if isinstance(m, web.Response):
        return m
    return _error(503, "no serving capacity: the inference data plane is not built yet")


def build_app(settings: Settings) -> web.Application:
    app = web.Application(client_max_size=settings.api.max_body_bytes)
    app[SETTINGS] = settings
    app.add_routes(
        [
            web.get("/v2/health/live", live),
            web.get("/v2/health/ready", ready),
            web.get("/v1/models", list_models),
            web.get("/v2/models/{name}", model_metadata),
            web.post("/v2/models/{name}/infer", predict),
            web.post(r"/v1/models/{name}:predict", predict),
        ]
    )
    return app
