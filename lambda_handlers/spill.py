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
from bouncer.fetch import FetchError, fetch_dir, fetch_file, is_s3
from bouncer.runner import ModelLoadError, ModelRunner

SOURCE_ENV = "MARK_MODEL_SOURCE"
CONTRACT_ENV = "MARK_MODEL_CONTRACT"

_runners: dict[str, ModelRunner] = {}
_lock = threading.Lock()  # one invocation at a time per runtime, but be safe under LMI threads


class SourceError(Exception):
    """The event names no model this function can load; the message says why."""


def local_artifact(contract: ModelContract, whole_dir: bool) -> ModelContract:
    """The contract with an ``s3://`` artifact fetched into the temporary directory:
    its version directory (``whole_dir``: a contract names one, and an ONNX model's
    weights or a handler's files lie beside it), or the one file a bare source names.

    Called once per runtime (the runner is cached), so each cold start reads the objects
    as they are now. A missing object or a denied read is the deployment's mistake,
    reported as ``SourceError``; anything else (S3 unreachable) raises."""
    if not is_s3(contract.artifact):
        return contract
    parent, _, name = contract.artifact.rpartition("/")
    digest = hashlib.sha256(contract.artifact.encode()).hexdigest()[:16]
    local = Path(tempfile.gettempdir()) / "mark-models" / digest
    try:
        if whole_dir:
            fetch_dir(parent, local)
        else:
            fetch_file(contract.artifact, local / name)
    except FetchError as exc:
        raise SourceError(f"model {contract.name!r}: {exc}") from None
    return replace(contract, artifact=str(local / name))


def contract_of(event: dict[str, Any], name: str, dtype: str) -> tuple[ModelContract, bool]:
    """The contract to run (the event's, the environment's, or one built from a source),
    and whether it was given as one (so its artifact's whole directory is the model's)."""
    given = event.get("contract") or os.environ.get(CONTRACT_ENV)
    if given:
        text = given if isinstance(given, str) else json.dumps(given)
        return ModelContract.from_json(text), True
    source = event.get("source") or os.environ.get(SOURCE_ENV)
    if not isinstance(source, str) or not source:
        raise SourceError(
            f"model {name!r} has no contract or source: pass 'contract' or 'source', "
            f"or set {CONTRACT_ENV} or {SOURCE_ENV}"
        )
    return legacy_contract(name, source, (), dtype), False


def cached_runner(contract: ModelContract, whole_dir: bool = True) -> tuple[ModelRunner, bool]:
    """The runner for ``contract`` and whether this call loaded it (a cold start)."""
    key = contract.to_json()
    with _lock:
        runner = _runners.get(key)
        if runner is not None:
            return runner, False
        runner = ModelRunner(local_artifact(contract, whole_dir))
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
        contract, given = contract_of(event, name, dtype_name)
        runner, cold = cached_runner(contract, whole_dir=given)
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
