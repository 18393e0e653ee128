"""AwsLambda, the Serverless port on Lambda, against the Invoke API stand-in.

The stand-in runs each invocation on real awslambdaric runtimes (``LocalLambda``),
so the adapter's whole path is real: botocore builds the Invoke request, the
handler runs in its own process, and the bill is read from the REPORT line.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch
from aiobotocore.session import get_session
from botocore.exceptions import ClientError

from mark.clock import ManualClock
from mark.cloud.aws.errors import RetryPolicy
from mark.cloud.aws.lambda_ import AwsLambda, chunk_events, parse_report
from mark.cloud.local.lambda_ import LocalLambda
from mark.cloud.standins.lambda_api import LambdaApi
from mark.errors import (
    CloudError,
    PayloadTooLarge,
    SpillFunctionError,
    SpillRejected,
    Throttled,
)

ROOT = Path(__file__).resolve().parents[3]
MLP = "tests.lambda_rt.fixtures_model:tiny_mlp"
BOOM = "tests.lambda_rt.fixtures_model:exploding"
FUNCTION = "mark-spill"
REGION = "us-east-1"


@pytest.fixture
async def api(aws_env: str) -> AsyncIterator[LambdaApi]:
    local = LocalLambda({"mlp": MLP, "boom": BOOM}, cwd=ROOT, memory_mb=1024, max_concurrency=2)
    await local.start()
    standin = LambdaApi(FUNCTION, local)
    await standin.start()
    try:
        yield standin
    finally:
        await standin.close()
        await local.close()


def test_the_report_line_is_what_lambda_bills() -> None:
    tail = (
        "START RequestId: 8f5 Version: $LATEST\nEND RequestId: 8f5\n"
        "REPORT RequestId: 8f5\tDuration: 102.25 ms\tBilled Duration: 1285 ms\t"
        "Memory Size: 2048 MB\tMax Memory Used: 312 MB\tInit Duration: 1182.41 ms\t\n"
    )
    r = parse_report(tail)
    assert r is not None
    assert (r.duration_ms, r.billed_ms, r.memory_mb, r.init_ms) == (102.25, 1285, 2048, 1182.41)
    assert parse_report("START RequestId: x\n") is None


def test_a_batch_over_the_payload_limit_is_split_in_order() -> None:
    rows = [[float(i)] * 100 for i in range(64)]
    events = chunk_events("m", rows, "src", limit=4000)
    assert len(events) > 1 and all(len(p) <= 4000 for p, _ in events)
    back = [r for p, _ in events for r in json.loads(p)["instances"]]
    assert back == rows and sum(n for _, n in events) == 64
    assert all(json.loads(p)["source"] == "src" for p, _ in events)
    with pytest.raises(PayloadTooLarge):
        chunk_events("m", [[0.0] * 2000], None, limit=4000)


async def test_invoke_runs_the_batch_and_bills_from_the_report(api: LambdaApi) -> None:
    from tests.lambda_rt.fixtures_model import tiny_mlp

    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(7)).tolist()
    async with AwsLambda(FUNCTION, region=REGION, endpoint_url=api.url, memory_mb=1024) as lam:
        first = await lam.invoke("mlp", x)
        again = await lam.invoke("mlp", x)
        expected = tiny_mlp()(torch.tensor(x)).tolist()
        for got in (first, again):
            assert torch.allclose(torch.tensor(got.outputs), torch.tensor(expected), atol=1e-5)
        assert first.cold_start and not again.cold_start
        assert first.billed_ms > again.billed_ms  # the first paid the runtime's init
        charges = lam.take_charges()
        assert [c.model for c in charges] == ["mlp"] and charges[0].requests == 2
        # Seconds, as the ledger keeps them: 1,009 ms is 1.009 s, which times 1000 is not
        # 1009.0 in floating point (a CI run billed exactly that).
        total_ms = first.billed_ms + again.billed_ms
        assert charges[0].billed_seconds == pytest.approx(total_ms / 1000, rel=1e-12)
        assert charges[0].gb_seconds == pytest.approx(charges[0].billed_seconds * 1024 / 1024)
        assert lam.take_charges() == []

        # Split under the payload limit, answers still in the batch's order.
        many = torch.randn(40, 4, generator=torch.Generator().manual_seed(8)).tolist()
        lam.payload_limit = 2000
        calls = api.invocations
        res = await lam.invoke("mlp", many)
        assert api.invocations - calls > 1
        want = tiny_mlp()(torch.tensor(many))
        assert torch.allclose(torch.tensor(res.outputs), want, atol=1e-5)


async def test_errors_are_typed(api: LambdaApi) -> None:
    async with AwsLambda(FUNCTION, region=REGION, endpoint_url=api.url) as lam:
        with pytest.raises(SpillFunctionError) as err:
            await lam.invoke("boom", [[1.0], [2.0]])
        assert err.value.kind == "Unhandled" and err.value.error_type == "FixtureFault"
        with pytest.raises(SpillRejected, match="cannot run this batch"):
            await lam.invoke("mlp", [[1.0, 2.0]])
        assert len(lam.take_charges()) == 2  # failed invocations are billed too
    async with AwsLambda("no-such-function", region=REGION, endpoint_url=api.url) as lam:
        with pytest.raises(CloudError, match="ResourceNotFoundException"):
            await lam.invoke("mlp", [[1.0] * 4])


async def test_warm_up_pings_runtimes_side_by_side(api: LambdaApi) -> None:
    async with AwsLambda(FUNCTION, region=REGION, endpoint_url=api.url) as lam:
        await lam.warm_up("mlp", 2)
        assert api.backend.cold_starts == 2  # two runtimes now hold the model
        res = await lam.invoke("mlp", [[0.0] * 4])
        assert not res.cold_start


async def test_provisioned_concurrency_is_set_on_the_alias(api: LambdaApi) -> None:
    async with AwsLambda(
        FUNCTION, region=REGION, endpoint_url=api.url, qualifier="live", provisioned_concurrency=3
    ) as lam:
        resp = await lam.ensure_provisioned_concurrency()
        assert resp is not None and resp["RequestedProvisionedConcurrentExecutions"] == 3
    # Read back and misuse through a client of the test's own (async: the stand-in
    # serves on this event loop).
    async with get_session().create_client(
        "lambda", region_name=REGION, endpoint_url=api.url
    ) as client:
        got = await client.get_provisioned_concurrency_config(
            FunctionName=FUNCTION, Qualifier="live"
        )
        assert got["Status"] == "READY" and got["AllocatedProvisionedConcurrentExecutions"] == 3
        with pytest.raises(ClientError, match="unpublished"):
            await client.put_provisioned_concurrency_config(
                FunctionName=FUNCTION, Qualifier="$LATEST", ProvisionedConcurrentExecutions=1
            )
    async with AwsLambda(FUNCTION, region=REGION, provisioned_concurrency=1) as lam:
        with pytest.raises(CloudError, match="alias or a published version"):
            await lam.ensure_provisioned_concurrency()


async def test_provisioned_concurrency_is_charged_from_set_to_removal(api: LambdaApi) -> None:
    """3 × 1024 MB set at t=1000 on the alias, removed at t=1450: billed 600 s (two
    5-minute steps) = 3 × 1 GB × 600 = 1800 GB-s, half to each model; the invocation made
    meanwhile was served on it and pays its duration at the provisioned rate."""
    from mark.billing import LAMBDA_ON_PC, LAMBDA_PC

    pc_rate, on_pc_rate = 0.0000041667, 0.0000097222  # us-east-1 x86 list prices
    clock = ManualClock(1000.0)
    async with AwsLambda(
        FUNCTION,
        region=REGION,
        endpoint_url=api.url,
        qualifier="live",
        provisioned_concurrency=3,
        models=("mlp", "boom"),
        memory_mb=1024,
        clock=clock,
    ) as lam:
        await lam.ensure_provisioned_concurrency()
        res = await lam.invoke("mlp", [[0.0] * 4])
        clock.advance(400.0)
        first = lam.take_charges()
        clock.advance(50.0)
        await lam.remove_provisioned_concurrency()
        clock.advance(500.0)  # removed: nothing accrues any more
        rest = lam.take_charges()
        assert lam.take_charges() == []
    assert "live" not in api.provisioned  # deleted on the function's alias
    (run,) = [e for e in first if e.component != LAMBDA_PC]
    assert (run.model, run.component, run.requests, run.unit_price) == (
        "mlp",
        LAMBDA_ON_PC,
        1,
        on_pc_rate,
    )
    assert run.cost == pytest.approx(res.billed_ms / 1000 * on_pc_rate + 0.2e-6)
    pc = [e for e in first + rest if e.component == LAMBDA_PC]
    assert sorted({e.model for e in pc}) == ["boom", "mlp"]
    assert [e.end for e in pc if e.model == "mlp"] == [1400.0, 1450.0]
    assert sum(e.billed_seconds for e in pc if e.model == "mlp") == 600.0
    assert sum(e.gb_seconds for e in pc) == pytest.approx(1800.0)
    assert sum(e.cost for e in pc) == pytest.approx(1800.0 * pc_rate)


async def test_without_provisioned_concurrency_invocations_are_on_demand(api: LambdaApi) -> None:
    async with AwsLambda(FUNCTION, region=REGION, endpoint_url=api.url, qualifier="live") as lam:
        assert await lam.ensure_provisioned_concurrency() is None
        await lam.invoke("mlp", [[0.0] * 4])
        await lam.remove_provisioned_concurrency()  # nothing set: nothing to delete
        (entry,) = lam.take_charges()
    assert entry.component == "lambda" and entry.unit_price == 0.0000166667


class _Throttling:
    def __init__(self, times: int) -> None:
        self.times = times
        self.calls = 0

    async def invoke(self, **_: Any) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.times:
            raise ClientError(
                {"Error": {"Code": "TooManyRequestsException", "Message": "Rate Exceeded."}},
                "Invoke",
            )

        class Body:
            async def read(self) -> bytes:
                return b'{"model": "m", "outputs": [[1.0]], "cold_start": false}'

        return {"Payload": Body(), "LogResult": base64.b64encode(b"no report").decode()}


async def test_throttling_is_retried_then_raised() -> None:
    clock = ManualClock()
    ok = _Throttling(2)
    lam = AwsLambda(FUNCTION, region=REGION, client=ok, clock=clock, retry=RetryPolicy(3, 0.01))
    res = await lam.invoke("m", [[0.0]])
    assert res.outputs == [[1.0]] and ok.calls == 3
    assert res.billed_ms >= 0 and lam.take_charges()[0].requests == 1  # measured, no REPORT
    lam = AwsLambda(
        FUNCTION, region=REGION, client=_Throttling(9), clock=clock, retry=RetryPolicy(3, 0.01)
    )
    with pytest.raises(Throttled):
        await lam.invoke("m", [[0.0]])
