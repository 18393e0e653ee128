"""Stand-in for Lambda's Invoke API in front of the local awslambdaric runtimes.

moto's Lambda only echoes the event unless it can run Docker, so a test of the
aws world could not exercise the spill path. This server answers the two
Lambda REST operations mark's ``AwsLambda`` adapter sends, in AWS's wire shape,
so the adapter runs unchanged with its endpoint pointed here:

* ``POST /2015-03-31/functions/{name}/invocations`` (Invoke, RequestResponse):
  the event runs on ``LocalLambda`` (real ``awslambdaric`` runtimes). Replies:
  200 with the handler's JSON; a handler that raised, timed out or whose
  runtime died is 200 with ``X-Amz-Function-Error: Unhandled`` and Lambda's
  ``{"errorType", "errorMessage"}`` body; busy at the concurrency limit is 429
  ``TooManyRequestsException``; over 6 MB is 413 ``RequestTooLargeException``.
  ``LogType: Tail`` returns a log tail ending in a ``REPORT`` line with the
  duration, billed duration (including the init, as AWS bills it) and memory.
* ``PUT|GET|DELETE /2019-09-30/functions/{name}/provisioned-concurrency``:
  bookkeeping only (``IN_PROGRESS`` when set, ``READY`` when read back); no
  runtime is pre-initialised.

Not emulated: asynchronous invocation, versions and aliases (any qualifier
runs the same code), and the
``Max Memory Used`` field of the report.
"""

from __future__ import annotations

import base64
import json
import math
import uuid
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from bouncer.contract import ModelContract
from mark.cloud.local.lambda_ import PAYLOAD_LIMIT, LocalLambda
from mark.errors import (
    CloudError,
    PayloadTooLarge,
    RuntimeExited,
    SpillFunctionError,
    SpillRejected,
    SpillThrottled,
    SpillTimeout,
)


class LambdaApi:
    """One function name served by a ``LocalLambda``; ``url`` is the endpoint to give clients."""

    def __init__(self, function_name: str, backend: LocalLambda, host: str = "127.0.0.1") -> None:
        self.function_name = function_name
        self.backend = backend
        self.host = host
        self.url = ""
        self.invocations = 0
        self.pings = 0  # invocations with no instances: warm-ups
        self.provisioned: dict[str, dict[str, Any]] = {}  # qualifier -> config
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application(client_max_size=2 * PAYLOAD_LIMIT)
        fn = "/2015-03-31/functions/{name}/invocations"
        pc = "/2019-09-30/functions/{name}/provisioned-concurrency"
        app.router.add_post(fn, self._invoke)
        app.router.add_put(pc, self._put_pc)
        app.router.add_get(pc, self._get_pc)
        app.router.add_delete(pc, self._delete_pc)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{self.host}:{port}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _known(self, request: web.Request) -> web.Response | None:
        name = request.match_info["name"].rsplit(":", 1)[-1]  # a name or an ARN
        if name != self.function_name:
            return _error(404, "ResourceNotFoundException", f"Function not found: {name}")
        return None

    async def _invoke(self, request: web.Request) -> web.Response:
        missing = self._known(request)
        if missing is not None:
            return missing
        if request.headers.get("X-Amz-Invocation-Type", "RequestResponse") != "RequestResponse":
            return _error(400, "InvalidParameterValueException", "only RequestResponse here")
        raw = await request.read()
        if len(raw) > PAYLOAD_LIMIT:
            return _error(413, "RequestTooLargeException", "Request must be smaller than 6 MB")
        try:
            event = json.loads(raw)
            model, instances = str(event["model"]), list(event["instances"])
            dtype = str(event.get("dtype", "float32"))
            # The event's own model, if it names one (a contract or a source), is the
            # runtime's to load, as on AWS; else the backend's configured one.
            given = event.get("contract") or event.get("source")
            source = (
                ModelContract.from_json(json.dumps(given))
                if isinstance(given, dict)
                else str(given)
                if given
                else None
            )
        except (ValueError, KeyError, TypeError):  # a ContractError is a ValueError
            return _error(400, "InvalidRequestContentException", "Could not parse request body")
        self.invocations += 1
        self.pings += not instances
        request_id = str(uuid.uuid4())
        headers = {"X-Amz-Executed-Version": "$LATEST", "X-Amzn-RequestId": request_id}
        report = ""
        try:
            result = await self.backend.invoke(model, instances, dtype, source=source)
            body: dict[str, Any] = {
                "model": model,
                "outputs": list(result.outputs),
                "cold_start": result.cold_start,
            }
            init_ms = result.billed_ms - math.ceil(result.duration_ms) if result.cold_start else 0
            report = _report(
                request_id,
                result.duration_ms,
                result.billed_ms,
                result.memory_mb,
                init_ms if init_ms > 0 else None,
            )
        except SpillThrottled:
            return _error(429, "TooManyRequestsException", "Rate Exceeded.")
        except PayloadTooLarge as exc:
            return _error(413, "RequestTooLargeException", str(exc))
        except SpillRejected as exc:  # the handler's own {"error": ...} answer
            body = {"error": str(exc).split(": ", 1)[-1]}
        except (SpillFunctionError, SpillTimeout, RuntimeExited, CloudError) as exc:
            error_type = (
                exc.error_type
                if isinstance(exc, SpillFunctionError)
                else "Sandbox.Timedout"
                if isinstance(exc, SpillTimeout)
                else "Runtime.ExitError"
            )
            headers["X-Amz-Function-Error"] = "Unhandled"
            body = {"errorType": error_type, "errorMessage": str(exc)}
        if request.headers.get("X-Amz-Log-Type") == "Tail":
            tail = f"START RequestId: {request_id} Version: $LATEST\n"
            tail += f"END RequestId: {request_id}\n{report}"
            headers["X-Amz-Log-Result"] = base64.b64encode(tail.encode()[-4096:]).decode()
        return web.json_response(body, headers=headers)

    def _config_target(self, request: web.Request) -> str | web.Response:
        """The qualifier a provisioned-concurrency call names, or the error AWS answers."""
        missing = self._known(request)
        if missing is not None:
            return missing
        q = request.query.get("Qualifier", "")
        if not q or q == "$LATEST":
            return _error(
                400,
                "InvalidParameterValueException",
                "Provisioned Concurrency Configs cannot be applied to unpublished "
                "function versions.",
            )
        return q

    async def _put_pc(self, request: web.Request) -> web.Response:
        q = self._config_target(request)
        if isinstance(q, web.Response):
            return q
        n = int((await request.json())["ProvisionedConcurrentExecutions"])
        self.provisioned[q] = {
            "RequestedProvisionedConcurrentExecutions": n,
            "LastModified": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S+0000"),
        }
        return web.json_response(
            {**self.provisioned[q], "AllocatedProvisionedConcurrentExecutions": 0}
            | {"AvailableProvisionedConcurrentExecutions": 0, "Status": "IN_PROGRESS"},
            status=202,
        )

    async def _get_pc(self, request: web.Request) -> web.Response:
        q = self._config_target(request)
        if isinstance(q, web.Response):
            return q
        cfg = self.provisioned.get(q)
        if cfg is None:
            return _error(404, "ProvisionedConcurrencyConfigNotFoundException", "No config found")
        n = cfg["RequestedProvisionedConcurrentExecutions"]
        return web.json_response(
            {
                **cfg,
                "AllocatedProvisionedConcurrentExecutions": n,
                "AvailableProvisionedConcurrentExecutions": n,
                "Status": "READY",
            }
        )

    async def _delete_pc(self, request: web.Request) -> web.Response:
        q = self._config_target(request)
        if isinstance(q, web.Response):
            return q
        self.provisioned.pop(q, None)
        return web.Response(status=204)


def _report(
    request_id: str, duration_ms: float, billed_ms: int, memory_mb: int, init_ms: float | None
) -> str:
    """Lambda's REPORT line (tab-separated fields, as CloudWatch Logs shows it)."""
    line = (
        f"REPORT RequestId: {request_id}\tDuration: {duration_ms:.2f} ms\t"
        f"Billed Duration: {billed_ms} ms\tMemory Size: {memory_mb} MB\t"
    )
    if init_ms is not None:
        line += f"Init Duration: {init_ms:.2f} ms\t"
    return line + "\n"


def _error(status: int, code: str, message: str) -> web.Response:
    """A Lambda REST error: the code in ``x-amzn-ErrorType``, as botocore reads it."""
    return web.json_response(
        {"Type": "User", "message": message}, status=status, headers={"x-amzn-ErrorType": code}
    )
