"""The ``Serverless`` port on AWS Lambda: synchronous ``Invoke`` of the spill function.

One batch is one ``RequestResponse`` invocation whose event is what
``lambda_handlers.spill`` reads (``{"model", "instances", "dtype", "source"?}``: the
rows are decoded as the model's dtype, so an int or uint8 model gets its own); a batch
whose event would exceed Lambda's 6 MB synchronous payload limit is split into
chunks invoked side by side. Failures are typed, in the spill family of
``mark.errors`` that the local Lambda raises too: a function error (the handler
raised, timed out or its runtime died: ``X-Amz-Function-Error``) is
``SpillFunctionError``; a ``{"error": ...}`` reply (the caller's mistake) is
``SpillRejected``; a reply without outputs is ``SpillError``; Lambda's throttling
of an invocation is retried briefly with jitter, then ``SpillThrottled`` (a
``Throttled``).

Billing: each invocation asks for the log tail (``LogType=Tail``) and reads
Lambda's own ``REPORT`` line (``Billed Duration``, ``Memory Size``, ``Init
Duration``), which is what the bill says; without one, the measured round trip
rounded up to the millisecond stands in, priced with the configured memory.
Charges accumulate per model until ``take_charges()`` moves them to the ledger.

Provisioned concurrency, when configured, is set with
``PutProvisionedConcurrencyConfig`` on the function's alias or version (AWS
allows it on nothing else) and ``warm_up`` pings runtimes concurrently so that
many distinct execution environments hold the model. It is billed from the
moment it is set until ``remove_provisioned_concurrency`` (the daemon leaves it
set when it stops, as it leaves the fleet running): ``take_charges`` adds the
configured time since the last call (component ``lambda-pc``, split evenly over
``models``). Invocations it serves pay a lower duration rate (``lambda-on-pc``).
Lambda does not say which environment served an invocation, so this adapter
counts one as served by provisioned concurrency when no more than the
configured number of its invocations were in flight, as Lambda routes to
provisioned environments first: exact when this daemon is the function's only
caller and the allocation is ready, an estimate otherwise.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiobotocore.config import AioConfig
from botocore.exceptions import BotoCoreError, ClientError

from mark.billing import (
    LAMBDA,
    LAMBDA_ON_PC,
    LambdaCharges,
    ProvisionedPeriod,
    gb_second_rate,
    lambda_charge,
    provisioned_rates,
)
from mark.catalog import LambdaPrices, load_catalog
from mark.clock import WallClock
from mark.cloud.aws.client import OwnedClient
from mark.cloud.aws.errors import AwsApiError, RetryPolicy, map_client_error
from mark.cloud.spill_event import Source, spill_event
from mark.errors import (
    CloudError,
    PayloadTooLarge,
    SpillError,
    SpillFunctionError,
    SpillRejected,
    SpillThrottled,
    Throttled,
)
from mark.ports import SPILL_PAYLOAD_LIMIT, Clock, SpillResult
from mark.state.records import LedgerEntry

PAYLOAD_LIMIT = SPILL_PAYLOAD_LIMIT
THROTTLE_CODES = frozenset({"TooManyRequestsException", "ThrottlingException"})
#: Lambda-side failures worth another try (its service or its ENI capacity).
TRANSIENT_CODES = frozenset(
    {"ServiceException", "EC2ThrottledException", "ResourceNotReadyException"}
)

_REPORT = re.compile(r"^REPORT RequestId:.*$", re.MULTILINE)
_FIELD = re.compile(r"(Duration|Billed Duration|Memory Size|Init Duration): ([0-9.]+) (ms|MB)")


@dataclass(frozen=True, slots=True)
class Report:
    """What Lambda's ``REPORT`` log line says about one invocation."""

    duration_ms: float
    billed_ms: int
    memory_mb: int
    init_ms: float | None = None


def parse_report(log_tail: str) -> Report | None:
    """The last ``REPORT`` line of a log tail, or ``None`` if there is none."""
    lines = _REPORT.findall(log_tail)
    if not lines:
        return None
    fields = {name: float(value) for name, value, _ in _FIELD.findall(lines[-1])}
    if "Billed Duration" not in fields or "Duration" not in fields:
        return None
    return Report(
        duration_ms=fields["Duration"],
        billed_ms=int(fields["Billed Duration"]),
        memory_mb=int(fields.get("Memory Size", 0)),
        init_ms=fields.get("Init Duration"),
    )


def chunk_events(
    model: str,
    rows: Sequence[Any],
    source: Source | None,
    limit: int = PAYLOAD_LIMIT,
    dtype: str = "float32",
) -> list[tuple[bytes, int]]:
    """Events (bytes, rows in it) for ``rows`` of ``dtype``, each at most ``limit`` bytes,
    in order."""
    event = spill_event(model, rows, source, dtype)
    payload = json.dumps(event, separators=(",", ":")).encode()
    if len(payload) <= limit:
        return [(payload, len(rows))]
    if len(rows) <= 1:
        raise PayloadTooLarge(f"one request of {model!r} is {len(payload)} bytes; limit {limit}")
    half = len(rows) // 2
    return chunk_events(model, rows[:half], source, limit, dtype) + chunk_events(
        model, rows[half:], source, limit, dtype
    )


@dataclass(frozen=True, slots=True)
class _Invoked:
    outputs: list[Any]
    duration_ms: float
    billed_ms: int
    memory_mb: int
    cold: bool


class AwsLambda(OwnedClient):
    """``Serverless`` on Lambda. ``sources`` (model -> contract, or a bare source) are sent
    in each event for a function that serves several models (a model repository in S3:
    each contract's artifact is there); a single-model function reads ``MARK_MODEL_SOURCE``.
    ``models`` are those the function serves, who share its provisioned concurrency's cost
    (none given: it is charged to the function's name)."""

    service = "lambda"
    payload_limit: int = PAYLOAD_LIMIT

    def __init__(
        self,
        function_name: str,
        *,
        region: str,
        endpoint_url: str | None = None,
        qualifier: str | None = None,
        sources: Mapping[str, Source] | None = None,
        models: Sequence[str] = (),
        memory_mb: int = 2048,
        provisioned_concurrency: int = 0,
        arch: str = "x86_64",
        prices: LambdaPrices | None = None,
        clock: Clock | None = None,
        retry: RetryPolicy | None = None,
        timeout_s: float = 60.0,
        client: Any = None,
    ) -> None:
        self.function_name = function_name
        self.region = region
        self.endpoint_url = endpoint_url
        self.qualifier = qualifier
        self.sources = dict(sources or {})
        self.models = tuple(models) or (function_name,)
        self.memory_mb = memory_mb
        self.provisioned_concurrency = provisioned_concurrency
        self.arch = arch
        self.prices = prices if prices is not None else load_catalog().lambda_prices
        self.clock: Clock = clock if clock is not None else WallClock()
        self.retry = retry if retry is not None else RetryPolicy(attempts=3, base_s=0.05)
        self.timeout_s = timeout_s
        self._client: Any = client
        self._client_cm: Any = None
        on_pc_rate = provisioned_rates(self.prices, arch)[1] if provisioned_concurrency else 0.0
        self._charges = LambdaCharges(gb_second_rate(self.prices, self.arch), on_pc_rate)
        self._periods: list[ProvisionedPeriod] = []  # the last one is open while configured
        self._in_flight = 0

    def _client_config(self) -> AioConfig:
        # Our retry layer only; a read timeout past the function's own; many spills at once.
        return AioConfig(
            retries={"mode": "standard", "total_max_attempts": 1},
            read_timeout=self.timeout_s + 10.0,
            max_pool_connections=64,
        )

    # -- the Serverless port ----------------------------------------------

    async def invoke(self, model: str, batch: Sequence[Any], dtype: str = "float32") -> SpillResult:
        """Run one batch of ``dtype`` rows (split under the payload limit); outputs in the
        batch's order."""
        rows = [_plain(x) for x in batch]
        events = chunk_events(model, rows, self.sources.get(model), self.payload_limit, dtype)
        done = await asyncio.gather(*(self._invoke(model, payload, n) for payload, n in events))
        outputs = [out for d in done for out in d.outputs]
        return SpillResult(
            outputs,
            max(d.duration_ms for d in done),
            sum(d.billed_ms for d in done),
            done[0].memory_mb,
            any(d.cold for d in done),
        )

    async def warm_up(self, model: str, concurrency: int) -> None:
        """Ping the function ``concurrency`` times at once, so as many runtimes load the model."""
        if concurrency < 1:
            return
        (payload, _), *_ = chunk_events(model, [], self.sources.get(model))
        await asyncio.gather(*(self._invoke(model, payload, 0) for _ in range(concurrency)))

    # -- provisioned concurrency ------------------------------------------

    async def ensure_provisioned_concurrency(self) -> dict[str, Any] | None:
        """Set the configured provisioned concurrency on the alias/version; ``None`` if off."""
        if self.provisioned_concurrency <= 0:
            return None
        if not self.qualifier or self.qualifier == "$LATEST":
            raise CloudError(
                "provisioned concurrency needs an alias or a published version "
                "(aws.spill_qualifier); AWS does not allow it on $LATEST"
            )
        resp: dict[str, Any] = await self._call(
            "put_provisioned_concurrency_config",
            FunctionName=self.function_name,
            Qualifier=self.qualifier,
            ProvisionedConcurrentExecutions=self.provisioned_concurrency,
        )
        now = self.clock.now()
        if self._provisioned is not None:  # set again: one period ends, the next begins
            self._provisioned.close(now)
        rate = provisioned_rates(self.prices, self.arch)[0]
        self._periods.append(
            ProvisionedPeriod(
                self.provisioned_concurrency, self.memory_mb, rate, self.models, start=now
            )
        )
        return resp

    async def remove_provisioned_concurrency(self) -> None:
        """Delete the provisioned concurrency this adapter set; its charge stops now."""
        if self._provisioned is None:
            return
        await self._call(
            "delete_provisioned_concurrency_config",
            FunctionName=self.function_name,
            Qualifier=self.qualifier,
        )
        self._provisioned.close(self.clock.now())

    @property
    def _provisioned(self) -> ProvisionedPeriod | None:
        """The period in force, if provisioned concurrency is set."""
        last = self._periods[-1] if self._periods else None
        return last if last is not None and last.end is None else None

    # -- accounting --------------------------------------------------------

    def take_charges(self) -> list[LedgerEntry]:
        """Charges since the last call, for ``Store.add_charges``: invocations, one entry per
        model and component, then the provisioned concurrency configured meanwhile."""
        out = self._charges.take()
        now = self.clock.now()
        for period in self._periods:
            out.extend(period.take(now))
        self._periods = [p for p in self._periods if not p.settled]
        return out

    # -- internals ---------------------------------------------------------

    async def _invoke(self, model: str, payload: bytes, rows: int) -> _Invoked:
        started = self.clock.now()
        t0 = time.perf_counter()
        kwargs: dict[str, Any] = {
            "FunctionName": self.function_name,
            "InvocationType": "RequestResponse",
            "LogType": "Tail",
            "Payload": payload,
        }
        if self.qualifier:
            kwargs["Qualifier"] = self.qualifier
        pc = self._provisioned
        self._in_flight += 1
        on_pc = pc is not None and self._in_flight <= pc.concurrency
        try:
            resp = await self._call("invoke", **kwargs)
            body = await resp["Payload"].read()
        finally:
            self._in_flight -= 1
        measured_ms = (time.perf_counter() - t0) * 1000.0
        tail = base64.b64decode(resp.get("LogResult") or b"").decode(errors="replace")
        report = parse_report(tail)
        memory = report.memory_mb if report is not None and report.memory_mb else self.memory_mb
        billed = report.billed_ms if report is not None else math.ceil(measured_ms - 1e-9)
        duration = report.duration_ms if report is not None else measured_ms
        self._account(model, started, duration, billed, memory, on_pc)
        reply = _json(body)
        function_error = resp.get("FunctionError")
        if function_error:
            err = reply if isinstance(reply, dict) else {}
            raise SpillFunctionError(
                str(err.get("errorType", "Unknown")),
                str(err.get("errorMessage", body[:500].decode(errors="replace"))),
                kind=str(function_error),
            )
        if not isinstance(reply, dict):
            raise SpillError(f"the spill function's reply for {model!r} is not a JSON object")
        if "error" in reply:
            raise SpillRejected(f"{model}: {reply['error']}")
        outputs = reply.get("outputs")
        if not isinstance(outputs, list) or len(outputs) != rows:
            raise SpillError(f"the spill function returned no outputs list of {rows} for {model!r}")
        cold = bool(reply.get("cold_start")) or (report is not None and report.init_ms is not None)
        return _Invoked(outputs, duration, billed, memory, cold)

    def _account(
        self,
        model: str,
        started: float,
        duration_ms: float,
        billed_ms: int,
        memory_mb: int,
        on_pc: bool,
    ) -> None:
        # lambda_charge rounds up to the ms; the REPORT line's billed figure is already whole.
        charge = lambda_charge(self.prices, float(billed_ms), memory_mb, 1, self.arch, on_pc)
        end = self.clock.now()
        self._charges.add(
            model, started, end, duration_ms, charge, LAMBDA_ON_PC if on_pc else LAMBDA
        )

    async def _call(self, operation: str, **kwargs: Any) -> Any:
        """One Lambda call; throttling and transient service errors retried with jitter."""
        if self._client is None:
            raise CloudError("AwsLambda is not open: use `async with` or `await open()`")
        method = getattr(self._client, operation)
        for attempt in range(self.retry.attempts):
            last = attempt + 1 >= self.retry.attempts
            try:
                return await method(**kwargs)
            except ClientError as err:
                code = str(err.response.get("Error", {}).get("Code", ""))
                if code in THROTTLE_CODES:
                    if last:
                        throttled = SpillThrottled if operation == "invoke" else Throttled
                        raise throttled(f"{operation}: {code}") from err
                elif code in TRANSIENT_CODES:
                    if last:
                        raise AwsApiError(operation, code, str(err)) from err
                else:
                    raise map_client_error(err, operation) from err
            except BotoCoreError as err:
                if last:
                    raise CloudError(f"{operation}: {err}") from err
            await self.clock.sleep(self.retry.delay(attempt))
        raise AssertionError("unreachable: the loop returns or raises")


def _json(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


def _plain(x: Any) -> Any:
    """Numpy arrays and tensors to lists, so a batch of either serialises as JSON."""
    tolist = getattr(x, "tolist", None)
    return tolist() if callable(tolist) else x
