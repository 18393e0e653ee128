"""The OpenAPI 3.0 document of the endpoint, generated from the configured models.

Built from the same settings the handlers validate against (shapes, dtypes,
names), so the document and the server cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from bouncer.wire import SERVED_BY_HEADER
from mark.config import Settings

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
        schema = {"type": "array", "items": schema, "minItems": d, "maxItems": d}
    return schema


def _item(dtype: str) -> dict[str, Any]:
    if dtype.startswith("float"):
        return {"type": "number"}
    if dtype == "bool":
        return {"type": "boolean"}
    return {"type": "integer"}


def openapi_document(settings: Settings, max_instances: int = 1024) -> dict[str, Any]:
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
    }
    for m in settings.models:
        item = _item(m.input.dtype)
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
                    "items": _nested(m.input.shape, item),
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
                            "name": {"type": "string"},
                            "shape": {
                                "type": "array",
                                "items": {"type": "integer", "minimum": 0},
                                "minItems": len(m.input.shape) + 1,
                                "maxItems": len(m.input.shape) + 1,
                            },
                            "datatype": {"type": "string"},
                            "data": {"type": "array"},
                        },
                    },
                },
            },
        }
        responses = {
            "400": _ERROR,
            "404": _ERROR,
            "413": _ERROR,
            "503": _ERROR,
        }
        paths[f"/v1/models/{m.name}:predict"] = {
            "post": {
                "summary": f"TF-Serving V1 predict on {m.name}",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": v1_body}},
                },
                "responses": {"200": _prediction({"predictions": {"type": "array"}}), **responses},
            }
        }
        paths["/v2/models/{name}/infer"] = {
            "post": {
                "summary": "Open Inference Protocol V2 infer",
                "parameters": [name_param],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": v2_body}},
                },
                "responses": {
                    "200": _prediction(
                        {"model_name": {"type": "string"}, "outputs": {"type": "array"}}
                    ),
                    **responses,
                },
            }
        }
        paths["/v2/models/{name}"] = {
            "get": {
                "summary": "model metadata",
                "parameters": [name_param],
                "responses": {"200": _json({"name": {"type": "string"}}), "404": _ERROR},
            }
        }
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
            'instance ids, or "lambda" for the spill function'
        ),
        "schema": {"type": "string"},
    }
}


def _prediction(props: dict[str, Any]) -> dict[str, Any]:
    return {**_json(props), "headers": _SERVED_BY}


def _simple(summary: str, props: dict[str, Any]) -> dict[str, Any]:
    return {"summary": summary, "responses": {"200": _json(props)}}
