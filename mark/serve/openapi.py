"""The OpenAPI 3.0 document of the endpoint, generated from the configured models.

Built from the same settings the handlers validate against (shapes, dtypes,
names), so the document and the server cannot drift apart. With ``api.auth`` it
declares the API key (``Authorization: Bearer`` or ``X-Api-Key``) on every
operation but the health checks, and the 401, 403 and 429 answers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bouncer.wire import SERVED_BY_HEADER
from mark.config import Settings
from mark.serve.auth import API_KEY_HEADER
from mark.serve.binary_tensors import HEADER_LENGTH, OCTET_STREAM

VERSION_PARAM = {
    "name": "version",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "enum": ["1"]},
}
_HEADER_LENGTH_PARAM = {
    "name": HEADER_LENGTH,
    "in": "header",
    "required": False,
    "description": "binary tensor data extension: the length of the JSON object that "
    "starts the body; the inputs' binary data follows it",
    "schema": {"type": "integer", "minimum": 0},
}

_ERROR = {
    "description": "what was wrong",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["error"],
                "properties": {"error": {"type": "string"}},
            }
        }
    },
}


def _nested(shape: tuple[int, ...], item: dict[str, Any]) -> dict[str, Any]:
    schema = item
    for d in reversed(shape):
        bounds = {"minItems": d, "maxItems": d} if d > 0 else {"minItems": 1}  # -1: any length
        schema = {"type": "array", "items": schema, **bounds}
    return schema


def _item(dtype: str) -> dict[str, Any]:
    """One value of the model's input as JSON Schema, bounded to what the dtype holds
    (the endpoint refuses the rest with a 400: ``mark.serve.codec``)."""
    if dtype == "bool":
        return {"type": "boolean"}
    if dtype.startswith("float"):
        top = float(np.finfo(np.dtype(dtype)).max)
        return {"type": "number", "minimum": -top, "maximum": top}
    info = np.iinfo(np.dtype(dtype))
    return {"type": "integer", "minimum": int(info.min), "maximum": int(info.max)}


SECURITY_SCHEMES = {
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "an API key from `mark keys create` (mark_<id>_<secret>)",
    },
    "apiKey": {"type": "apiKey", "in": "header", "name": API_KEY_HEADER},
}
_AUTH_ERRORS = {
    "401": {**_ERROR, "description": "no API key, or not a valid one"},
    "403": {**_ERROR, "description": "the key lacks the scope this operation needs"},
    "429": {
        **_ERROR,
        "description": "over the key's rate or concurrency limit",
        "headers": {"Retry-After": {"schema": {"type": "integer", "minimum": 1}}},
    },
}


def openapi_document(settings: Settings, max_instances: int = 1024) -> dict[str, Any]:
    doc = _document(settings, max_instances)
    if not settings.api.auth:
        return doc
    for path, item in doc["paths"].items():
        for op in item.values():
            if path.startswith("/v2/health/"):
                op["security"] = []  # the load balancer's checks: open
            else:
                op["responses"] = {**op["responses"], **_AUTH_ERRORS}
    doc["components"] = {"securitySchemes": SECURITY_SCHEMES}
    doc["security"] = [{"bearer": []}, {"apiKey": []}]
    return doc


def _document(settings: Settings, max_instances: int) -> dict[str, Any]:
    names = [m.name for m in settings.models]
    paths: dict[str, Any] = {
        "/v2/health/live": {"get": _simple("liveness", {"live": {"type": "boolean"}})},
        "/v2/health/ready": {
            "get": {
                **_simple("readiness", {"ready": {"type": "boolean"}}),
                "responses": {
                    "200": _json({"ready": {"type": "boolean"}}),
                    "503": _json({"ready": {"type": "boolean"}}),
                },
            }
        },
        "/v1/models": {"get": _simple("configured models", {"models": {"type": "array"}})},
        "/v2": {
            "get": _simple(
                "server metadata",
                {
                    "name": {"type": "string"},
                    "version": {"type": "string"},
                    "extensions": {"type": "array", "items": {"type": "string"}},
                },
            )
        },
    }
    for m in settings.models:
        tensor = m.input_tensor
        shape = tensor.shape or ()
        item = _item(tensor.dtype)
        name_param = {
            "name": "name",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "enum": names},
        }
        v1_body = {
            "type": "object",
            "required": ["instances"],
            "properties": {
                "instances": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": max_instances,
                    "items": _nested(shape, item),
                }
            },
        }
        v2_body = {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "id": {"type": "string"},
                "inputs": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "shape", "datatype", "data"],
                        "properties": {
                            "name": {"type": "string", "enum": [tensor.name]},
                            "shape": {
                                "type": "array",
                                "items": {"type": "integer", "minimum": 0},
                                "minItems": len(shape) + 1,
                                "maxItems": len(shape) + 1,
                            },
                            "datatype": {"type": "string"},
                            "data": {"type": "array"},
                            "parameters": {
                                "type": "object",
                                "properties": {
                                    "binary_data_size": {"type": "integer", "minimum": 0}
                                },
                            },
                        },
                    },
                },
                "outputs": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string", "enum": ["output"]},
                            "parameters": {
                                "type": "object",
                                "properties": {"binary_data": {"type": "boolean"}},
                            },
                        },
                    },
                },
                "parameters": {
                    "type": "object",
                    "properties": {"binary_data_output": {"type": "boolean"}},
                },
            },
        }
        responses = {
            "400": _ERROR,
            "404": _ERROR,
            "413": _ERROR,
            "503": _ERROR,
        }
        v1_predict = {
            "post": {
                "summary": f"TF-Serving V1 predict on {m.name}",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": v1_body}},
                },
                "responses": {"200": _prediction({"predictions": {"type": "array"}}), **responses},
            }
        }
        paths[f"/v1/models/{m.name}:predict"] = v1_predict
        paths[f"/v1/models/{m.name}/versions/{{version}}:predict"] = _versioned(v1_predict)
        v1_status = {
            "get": {
                "summary": "TF-Serving V1 model status (AVAILABLE while ready, else LOADING)",
                "parameters": [name_param],
                "responses": {
                    "200": _json({"model_version_status": {"type": "array"}}),
                    "404": _ERROR,
                },
            }
        }
        infer = {
            "post": {
                "summary": "Open Inference Protocol V2 infer (JSON or binary tensor data)",
                "parameters": [name_param, _HEADER_LENGTH_PARAM],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": v2_body},
                        OCTET_STREAM: {"schema": {"type": "string", "format": "binary"}},
                    },
                },
                "responses": {
                    "200": _infer_ok(),
                    **responses,
                },
            }
        }
        metadata = {
            "get": {
                "summary": "model metadata",
                "parameters": [name_param],
                "responses": {"200": _json({"name": {"type": "string"}}), "404": _ERROR},
            }
        }
        ready = {
            "get": {
                "summary": "model readiness: an instance or the spill function can serve it",
                "parameters": [name_param],
                "responses": {
                    "200": _json({"name": {"type": "string"}, "ready": {"type": "boolean"}}),
                    "400": _json({"name": {"type": "string"}, "ready": {"type": "boolean"}}),
                    "404": _ERROR,
                },
            }
        }
        for prefix, version in (("", False), ("/versions/{version}", True)):
            for path, item in (
                (f"/v1/models/{{name}}{prefix}", v1_status),
                (f"/v2/models/{{name}}{prefix}", metadata),
                (f"/v2/models/{{name}}{prefix}/ready", ready),
                (f"/v2/models/{{name}}{prefix}/infer", infer),
            ):
                paths[path] = _versioned(item) if version else item
    return {
        "openapi": "3.0.3",
        "info": {"title": "mark inference endpoint", "version": "1"},
        "paths": paths,
    }


def _json(props: dict[str, Any]) -> dict[str, Any]:
    return {
        "description": "OK",
        "content": {"application/json": {"schema": {"type": "object", "properties": props}}},
    }


_SERVED_BY = {
    SERVED_BY_HEADER: {
        "description": (
            "who answered, comma-separated if the request's instances went to several: "
            'instance ids, or "lambda" for the spill function; sent to admin keys only'
        ),
        "schema": {"type": "string"},
    }
}


def _prediction(props: dict[str, Any]) -> dict[str, Any]:
    return {**_json(props), "headers": _SERVED_BY}


def _versioned(item: dict[str, Any]) -> dict[str, Any]:
    """The same operations under ``/versions/{version}``."""
    return {
        method: {**op, "parameters": [*op.get("parameters", []), VERSION_PARAM]}
        for method, op in item.items()
    }


def _infer_ok() -> dict[str, Any]:
    ok = _prediction(
        {
            "model_name": {"type": "string"},
            "model_version": {"type": "string"},
            "outputs": {"type": "array"},
        }
    )
    ok["content"][OCTET_STREAM] = {"schema": {"type": "string", "format": "binary"}}
    ok["headers"] = {
        **ok["headers"],
        HEADER_LENGTH: {
            "description": "with binary output: the length of the JSON object before it",
            "schema": {"type": "integer"},
        },
    }
    return ok


def _simple(summary: str, props: dict[str, Any]) -> dict[str, Any]:
    return {"summary": summary, "responses": {"200": _json(props)}}
