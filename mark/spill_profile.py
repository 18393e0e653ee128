"""The spill function's batch latency, measured through the world's function: what sizes
batched spill (``bouncer.routing.spill_chunks``).

A batch on Lambda is timed as the dispatcher sees it, from the invoke to the reply (the
network and the event's encoding included), on a warm runtime, median of runs, for each
batch size; zeros of the model's input shapes stand in for requests (a model's time does
not depend on its input values). The aws world times the deployed function
(``aws.spill_function``, its memory ``aws.spill_memory_mb``); the local world its local
runtimes (``local.lambda_memory_mb``), which run on this machine's CPU rather than
Lambda's, so that profile is for trying the feature, not for the aws world.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from bouncer.contract import ModelContract
from mark.config import ModelSpec, Settings
from mark.ports import Serverless


def example_rows(contract: ModelContract, batch: int) -> list[Any]:
    """``batch`` rows of zeros as the dispatcher sends them: bare values for a model of one
    input, objects by input name for one of several."""
    arrays = contract.example(batch)
    if len(contract.inputs) == 1:
        return [row.tolist() for row in arrays[contract.inputs[0].name]]
    return [{name: a[i].tolist() for name, a in arrays.items()} for i in range(batch)]


async def measure_spill(
    serverless: Serverless,
    contract: ModelContract,
    sizes: Sequence[int],
    runs: int,
    advance: Callable[[], None] = lambda: None,
) -> dict[int, float]:
    """Seconds per batch, by batch size: one warm-up invocation, then the median of
    ``runs`` round trips; ``advance`` is called after each invocation (a progress bar)."""
    dtype = contract.inputs[0].dtype
    table: dict[int, float] = {}
    for b in sizes:
        rows = example_rows(contract, b)
        await serverless.invoke(contract.name, rows, dtype=dtype)  # warm: the model loaded
        advance()
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            await serverless.invoke(contract.name, rows, dtype=dtype)
            times.append(time.perf_counter() - t)
            advance()
        table[b] = statistics.median(times)
    return table


@asynccontextmanager
async def spill_function(
    settings: Settings, spec: ModelSpec, contract: ModelContract
) -> AsyncIterator[Serverless]:
    """The world's spill function for ``spec``, opened for the measurement and closed after."""
    if settings.world == "aws":
        from mark.cloud.aws.lambda_ import AwsLambda

        aws = settings.aws
        if aws.spill_function is None:
            raise ValueError("aws.spill_function is not set: there is no function to measure")
        lam = AwsLambda(
            aws.spill_function,
            region=aws.region,
            endpoint_url=aws.lambda_endpoint_url or aws.endpoint_url,
            qualifier=aws.spill_qualifier,
            sources={spec.name: contract} if spec.location else {},
            memory_mb=aws.spill_memory_mb,
        )
        await lam.open()
        try:
            yield lam
        finally:
            await lam.close()
        return
    from mark.cloud.local import LocalLambda
    from mark.cloud.local.world import lambda_threads

    threads = lambda_threads(settings.local.lambda_concurrency)  # as the world's runtimes
    local = LocalLambda(
        {spec.name: contract},
        env={**threads, "MARK_DATA_DIR": str(settings.data_dir)},
        max_concurrency=1,
        memory_mb=settings.local.lambda_memory_mb,
    )
    await local.start()
    try:
        yield local
    finally:
        await local.close()
