"""Health, readiness and metadata routes: V2 server and model metadata, model readiness,
TF-Serving's model status, the model list.

A model is ready while a request has somewhere to go: an instance, or the spill
function. Readiness (``/v2/health/ready``, and each model's) follows
``mark.serve.intake``: false until the daemon's first agent sync, and false again
from the moment it drains.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bouncer.contract import TensorSpec
from mark.serve.api_state import (
    STATE,
    can_serve,
    json_response,
    not_ready,
    served_model,
)
from mark.serve.codec import V2_TYPES
from mark.serve.intake import Phase

EXTENSIONS = ["binary_tensor_data"]
"""The V2 protocol extensions implemented, as server metadata lists them."""


async def live(_: web.Request) -> web.Response:
    return json_response({"live": True})


async def ready(request: web.Request) -> web.Response:
    """200 while the endpoint serves; 503 while it starts (its instances not synced yet)
    and from the moment it drains, so a load balancer sends it nothing then."""
    ok = request.app[STATE].intake.ready
    return json_response({"ready": ok}, 200 if ok else 503)


async def server_metadata(request: web.Request) -> web.Response:
    return json_response(
        {"name": "mark", "version": request.app[STATE].version, "extensions": EXTENSIONS}
    )


async def model_ready(request: web.Request) -> web.Response:
    """200 when ready; otherwise 400, as the V2 protocol (and Triton) answer "false"."""
    served = served_model(request)
    state = request.app[STATE]
    if can_serve(state, served):
        return json_response({"name": served.spec.name, "ready": True})
    return json_response({"name": served.spec.name, "ready": False, "error": not_ready(state)}, 400)


async def list_models(request: web.Request) -> web.Response:
    return json_response({"models": sorted(request.app[STATE].models)})


async def model_status_v1(request: web.Request) -> web.Response:
    """TF-Serving's model status: version 1 is AVAILABLE while ready, else LOADING.

    TF-Serving's states are UNKNOWN, START, LOADING, AVAILABLE, UNLOADING and END;
    a model waiting for capacity (or for the daemon's first agent sync) is LOADING, one
    of a draining daemon UNLOADING, with error code UNAVAILABLE saying why.
    """
    served = served_model(request)
    state = request.app[STATE]
    ok = can_serve(state, served)
    draining = state.intake.phase is Phase.DRAINING
    status = {
        "version": served.spec.version,
        "state": "AVAILABLE" if ok else "UNLOADING" if draining else "LOADING",
        "status": {
            "error_code": "OK" if ok else "UNAVAILABLE",
            "error_message": "" if ok else not_ready(state),
        },
    }
    return json_response({"model_version_status": [status]})


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
    m = served_model(request).spec
    return json_response(
        {
            "name": m.name,
            "versions": [m.version],
            "platform": PLATFORMS[m.model_format],
            "inputs": [_tensor_metadata(t.spec()) for t in m.inputs],
            "outputs": [_tensor_metadata(t.spec()) for t in m.outputs],
            "slo": {"rt_max_ms": m.slo.rt_max_ms, "sl_min": m.slo.sl_min},
        }
    )
