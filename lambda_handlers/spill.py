"""The spill function: what runs on AWS Lambda when an instance cannot finish a batch in time.

Event: ``{"model": name, "instances": [...], "contract": optional, "source": optional,
"dtype": optional}``, each instance the one input's value or an object by input name.
Reply: ``{"model": name, "outputs": [...], "cold_start": bool}``, each output the one
output's value or an object by output name, as the instances came;
or ``{"error": "..."}`` for anything the caller got wrong, because a client's mistake
is a normal answer, not a Lambda function error (which would look like an outage in
the metrics).

The model is loaded once per runtime and kept in a module-level cache: a Lambda
execution environment lives for many invocations, and loading a model costs far
more than running a small batch. ``cold_start`` says whether this invocation paid
for that load. What to load is the model's contract (``bouncer.contract``: format,
artifact, tensors), from the event's ``contract`` (the local world sends each
model's) or the environment variable ``MARK_MODEL_CONTRACT``; failing both, a bare
source (the event's ``source`` or ``MARK_MODEL_SOURCE``: a TorchScript or ONNX file,
or ``package.module:factory``) with one input of the event's ``dtype``. An artifact
at ``s3://bucket/key`` is fetched into the temporary directory (``/tmp``, the only
writable path on Lambda) when the runtime first loads it, with boto3's usual
configuration (region, credentials and endpoint, e.g. ``AWS_ENDPOINT_URL_S3``, from
the environment).

The model runs through ``bouncer.runner`` as on an instance, so its outputs are
checked against the contract and cast to its types: the same input gives the same
numbers whoever serves it. This module imports nothing from ``mark``; the runner
imports only the runtime of the model's format (torch, or onnxruntime).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bouncer.contract import DTYPES, ContractError, ModelContract, legacy_contract
from bouncer.runner import ModelLoadError, ModelRunner

SOURCE_ENV = "MARK_MODEL_SOURCE"
CONTRACT_ENV = "MARK_MODEL_CONTRACT"
S3_SCHEME = "s3://"

_runners: dict[str, ModelRunner] = {}
_lock = threading.Lock()  # one invocation at a time per runtime, but be safe under LMI threads


class SourceError(Exception):
    """The model's artifact names nothing loadable; the message says what was tried."""


def s3_location(source: str) -> tuple[str, str]:
    """(bucket, key) of an ``s3://bucket/key`` source, or ``SourceError``."""
    bucket, _, key = source.removeprefix(S3_SCHEME).partition("/")
    if not bucket or not key or key.endswith("/"):
        raise SourceError(f"model source {source!r} is not s3://bucket/key of a file")
    return bucket, key


def fetch_from_s3(source: str) -> Path:
    """Download an ``s3://`` artifact into the temporary directory; the local path.

    Called once per runtime (the loaded model is cached), so each cold start reads
    the object as it is now. A missing object or a denied read is the deployment's
    mistake, reported as ``SourceError``; anything else (S3 unreachable) raises.
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
        raise SourceError(f"cannot read model {source}: {exc}") from None
    os.replace(partial, target)  # a crash mid-download never leaves a half file in place
    return target


def contract_of(event: dict[str, Any], name: str, dtype: str) -> ModelContract:
    """The contract to run: the event's, the environment's, or one built from a source."""
    given = event.get("contract") or os.environ.get(CONTRACT_ENV)
    if given:
        text = given if isinstance(given, str) else json.dumps(given)
        return ModelContract.from_json(text)
    source = event.get("source") or os.environ.get(SOURCE_ENV)
    if not isinstance(source, str) or not source:
        raise SourceError(
            f"model {name!r} has no contract or source: pass 'contract' or 'source', "
            f"or set {CONTRACT_ENV} or {SOURCE_ENV}"
        )
    return legacy_contract(name, source, (), dtype)


def cached_runner(contract: ModelContract) -> tuple[ModelRunner, bool]:
    """The runner for ``contract`` and whether this call loaded it (a cold start)."""
    key = contract.to_json()
    with _lock:
        runner = _runners.get(key)
        if runner is not None:
            return runner, False
        if contract.artifact.startswith(S3_SCHEME):
            contract = replace(contract, artifact=str(fetch_from_s3(contract.artifact)))
        runner = ModelRunner(contract)
        _runners[key] = runner
        return runner, True


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
    if dtype_name not in DTYPES:
        return _error(f"'dtype' must be one of {', '.join(DTYPES)}, got {dtype_name!r}")
    try:
        contract = contract_of(event, name, dtype_name)
        runner, cold = cached_runner(contract)
    except (SourceError, ModelLoadError, ContractError) as exc:
        return _error(str(exc))
    if not instances:  # a warm-up ping: the model is loaded, nothing to run
        return {"model": name, "outputs": [], "cold_start": cold}

    if isinstance(instances[0], dict):  # rows by input name: a model's several tensors
        return _run_named(name, runner, contract, instances, cold)
    tensor_in = contract.inputs[0]
    try:
        with np.errstate(all="ignore"):
            batch = np.asarray(instances, dtype=tensor_in.dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        return _error(f"'instances' must be a rectangular array of {tensor_in.dtype}: {exc}")
    try:
        out = runner.run({tensor_in.name: batch})[contract.outputs[0].name]
    except ContractError as exc:
        return _error(str(exc))
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        # a runtime reports a wrong shape or dtype as one of these; anything else is a bug
        # in the model and propagates as a Lambda function error.
        return _error(f"model {name!r} cannot run this batch (shape {list(batch.shape)}): {exc}")
    return {"model": name, "outputs": out.tolist(), "cold_start": cold}


def _run_named(
    name: str, runner: ModelRunner, contract: ModelContract, rows: list[Any], cold: bool
) -> dict[str, Any]:
    """Rows that are objects by input name: each row's outputs, by output name."""
    try:
        batch = {
            t.name: np.asarray([r[t.name] for r in rows], dtype=t.dtype) for t in contract.inputs
        }
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        names = [t.name for t in contract.inputs]
        return _error(f"each instance must hold the inputs {names} as arrays: {exc}")
    try:
        out = runner.run(batch)
    except ContractError as exc:
        return _error(str(exc))
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        shapes = {n: list(a.shape) for n, a in batch.items()}
        return _error(f"model {name!r} cannot run this batch (shapes {shapes}): {exc}")
    listed = {n: a.tolist() for n, a in out.items()}
    outputs = [{n: v[i] for n, v in listed.items()} for i in range(len(rows))]
    return {"model": name, "outputs": outputs, "cold_start": cold}
