"""The spill function: what runs on AWS Lambda when an instance cannot finish a batch in time.

Event: ``{"model": name, "instances": [...], "source": optional, "dtype": optional}``.
Reply: ``{"model": name, "outputs": [...], "cold_start": bool}``, or ``{"error": "..."}``
for anything the caller got wrong, because a client's mistake is a normal answer,
not a Lambda function error (which would look like an outage in the metrics).

The model is loaded once per runtime and kept in a module-level cache: a Lambda
execution environment lives for many invocations, and loading a torch model
costs far more than running a small batch. ``cold_start`` says whether this
invocation paid for that load. The model's location comes from the event's
``source`` (the local world sends each model's) or, for a function deployed
for one model, from the environment variable ``MARK_MODEL_SOURCE`` (the stack
sets it; the aws world sends no source, since a path on the controller means
nothing here). A source is a TorchScript file, ``package.module:factory``, or
``s3://bucket/key`` of a TorchScript file: fetched into the temporary directory
(``/tmp``, the only writable path on Lambda) when the runtime first loads it,
with boto3's usual configuration (region, credentials and endpoint, e.g.
``AWS_ENDPOINT_URL_S3``, from the environment).

This module imports nothing from ``mark``: its only third-party imports are
torch and boto3, which is all the container image installs for it.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

import torch

SOURCE_ENV = "MARK_MODEL_SOURCE"
S3_SCHEME = "s3://"

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}

_models: dict[str, torch.nn.Module] = {}
_lock = threading.Lock()  # one invocation at a time per runtime, but be safe under LMI threads


class ModelLoadError(Exception):
    """The model's source names nothing loadable; the message says what was tried."""


def is_factory(source: str) -> bool:
    """Same rule as ``ModelSpec.loader``: ``pkg.mod:factory`` unless that names a real file
    (or is an ``s3://`` URL, whose colon is the scheme's)."""
    return ":" in source and not source.startswith(S3_SCHEME) and not Path(source).exists()


def s3_location(source: str) -> tuple[str, str]:
    """(bucket, key) of an ``s3://bucket/key`` source, or ``ModelLoadError``."""
    bucket, _, key = source.removeprefix(S3_SCHEME).partition("/")
    if not bucket or not key or key.endswith("/"):
        raise ModelLoadError(f"model source {source!r} is not s3://bucket/key of a file")
    return bucket, key


def fetch_from_s3(source: str) -> Path:
    """Download an ``s3://`` model into the temporary directory; the local path.

    Called once per runtime (the loaded model is cached), so each cold start reads
    the object as it is now. A missing object or a denied read is the deployment's
    mistake, reported as ``ModelLoadError``; anything else (S3 unreachable) raises.
    """
    bucket, key = s3_location(source)
    import boto3  # only an s3:// source needs it; imported here to keep other cold starts lean
    from botocore.exceptions import ClientError

    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    target = Path(tempfile.gettempdir()) / "mark-models" / f"{digest}{Path(key).suffix}"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    try:
        boto3.client("s3").download_file(bucket, key, str(partial))
    except ClientError as exc:
        raise ModelLoadError(f"cannot read model {source}: {exc}") from None
    os.replace(partial, target)  # a crash mid-download never leaves a half file in place
    return target


def load_model(source: str) -> torch.nn.Module:
    """Load a TorchScript file (local or in S3) or call ``package.module:factory``;
    returned in eval mode."""
    if source.startswith(S3_SCHEME):
        return _load_torchscript(fetch_from_s3(source), shown=source)
    if is_factory(source):
        mod_name, _, attr = source.partition(":")
        if not mod_name or not attr:
            raise ModelLoadError(f"model source {source!r} is not 'package.module:factory'")
        try:
            module = importlib.import_module(mod_name)
        except ImportError as exc:
            raise ModelLoadError(
                f"cannot import {mod_name!r} for model source {source!r}: {exc}"
            ) from exc
        factory = getattr(module, attr, None)
        if not callable(factory):
            raise ModelLoadError(f"{mod_name!r} has no callable {attr!r} (model source {source!r})")
        model = factory()
        if not isinstance(model, torch.nn.Module):
            raise ModelLoadError(
                f"factory {source!r} returned {type(model).__name__}, expected a torch.nn.Module"
            )
        model.eval()
        return model
    return _load_torchscript(Path(source), shown=source)


def _load_torchscript(path: Path, shown: str) -> torch.nn.Module:
    if not path.is_file():
        raise ModelLoadError(f"model file {shown!r} does not exist")
    try:
        with warnings.catch_warnings():
            # TorchScript is the format mark's configuration names; torch 2.13 warns on
            # every load that it is deprecated, which would be noise in each runtime's log.
            warnings.simplefilter("ignore", DeprecationWarning)
            model: torch.nn.Module = torch.jit.load(  # type: ignore[no-untyped-call]
                str(path), map_location="cpu"
            )
    except (RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"{shown!r} is not a TorchScript file: {exc}") from None
    model.eval()
    return model


def cached_model(source: str) -> tuple[torch.nn.Module, bool]:
    """The model for ``source`` and whether this call loaded it (a cold start of the model)."""
    with _lock:
        model = _models.get(source)
        if model is not None:
            return model, False
        model = load_model(source)
        _models[source] = model
        return model, True


def _error(message: str) -> dict[str, Any]:
    return {"error": message}


def handler(event: Any, context: Any) -> dict[str, Any]:
    """Run one batch; the Lambda entry point (``lambda_handlers.spill.handler``)."""
    if not isinstance(event, dict):
        return _error(f"the event must be a JSON object, got {type(event).__name__}")
    name = event.get("model")
    if not isinstance(name, str) or not name:
        return _error("'model' must be a non-empty string")
    instances = event.get("instances")
    if not isinstance(instances, list):
        return _error("'instances' must be a JSON array (one entry per request in the batch)")
    dtype_name = event.get("dtype", "float32")
    dtype = DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None:
        return _error(f"'dtype' must be one of {', '.join(DTYPES)}, got {dtype_name!r}")
    source = event.get("source") or os.environ.get(SOURCE_ENV)
    if not isinstance(source, str) or not source:
        return _error(f"model {name!r} has no source: pass 'source' or set {SOURCE_ENV}")

    try:
        model, cold = cached_model(source)
    except ModelLoadError as exc:
        return _error(str(exc))
    if not instances:  # a warm-up ping: the model is loaded, nothing to run
        return {"model": name, "outputs": [], "cold_start": cold}

    try:
        batch = torch.as_tensor(instances, dtype=dtype)
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
        return _error(f"'instances' must be a rectangular array of {dtype_name}: {exc}")
    try:
        with torch.inference_mode():
            out = model(batch)
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        # torch reports a wrong shape or dtype as one of these; anything else is a bug
        # in the model and propagates as a Lambda function error.
        return _error(f"model {name!r} cannot run this batch (shape {list(batch.shape)}): {exc}")
    if not isinstance(out, torch.Tensor):
        return _error(f"model {name!r} returned {type(out).__name__}, expected a tensor")
    return {"model": name, "outputs": out.tolist(), "cold_start": cold}
