"""Batched spill through the real awslambdaric runtime: the spill function's batch latency
measured through it (``mark.spill_profile``), and a dispatcher that spills a burst in the
invocations ``bouncer.routing.spill_chunks`` makes of it, every row answered correctly."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import ModuleType

import aiohttp
import numpy as np
import torch

from bouncer.contract import ModelContract, TensorSpec
from bouncer.latency import BatchLatency
from mark.cloud.local import LocalLambda
from mark.serve.dispatcher import Dispatcher
from mark.serve.telemetry import Telemetry
from mark.spill_profile import example_rows, measure_spill

MLP = "tests.lambda_rt.fixtures_model:tiny_mlp"
# A contract naming the fixture model by import path: 4 features in, 3 out.
CONTRACT = ModelContract(
    name="mlp",
    version="1",
    format="pytorch",
    artifact=MLP,
    inputs=(TensorSpec("input", "float32", (4,)),),
    outputs=(TensorSpec("output", "float32", (3,)),),
)


async def test_the_spill_function_is_timed_at_every_batch_size(project_root: Path) -> None:
    lam = LocalLambda({"mlp": CONTRACT}, cwd=project_root, max_concurrency=1)
    await lam.start()
    try:
        done: list[int] = []
        table = await measure_spill(lam, CONTRACT, [1, 4, 16], 3, lambda: done.append(1))
    finally:
        await lam.close()
    assert sorted(table) == [1, 4, 16] and all(t > 0 for t in table.values())
    assert len(done) == 3 * (3 + 1)  # a warm-up and three timed runs per size
    assert lam.usage().requests == 12  # every one a real invocation
    assert example_rows(CONTRACT, 2) == [[0.0] * 4, [0.0] * 4]


async def _burst(lam: LocalLambda, curve: BatchLatency | None, x: np.ndarray) -> list[object]:
    async with aiohttp.ClientSession() as session:
        d = Dispatcher(
            "mlp",
            5.0,
            "float32",
            time.time,
            session,
            lam,
            Telemetry("mlp", rt_max_ms=5000.0, sample_window_s=5),
            spill_batches=curve,
        )
        d.start()
        try:
            # One request per row, all at once: no instance, so all of them spill.
            outs = await asyncio.gather(*(d.submit(x[i : i + 1]) for i in range(len(x))))
        finally:
            await d.close()
    return [o[0].output for o in outs]


async def test_a_burst_spills_in_batches_with_every_row_answered(
    project_root: Path, fixture_models: ModuleType
) -> None:
    x = np.random.default_rng(7).random((12, 4), dtype=np.float32)
    with torch.inference_mode():
        want = fixture_models.tiny_mlp().eval()(torch.from_numpy(x)).numpy()
    lam = LocalLambda({"mlp": CONTRACT}, cwd=project_root, max_concurrency=2)
    await lam.start()
    try:
        await lam.warm_up("mlp", 2)
        calls = [lam.usage().requests]
        alone = await _burst(lam, None, x)
        calls.append(lam.usage().requests)
        # Measured up to 8: chunks of at most 8, each finishing well within RT_max (5 s).
        batched = await _burst(lam, BatchLatency.from_mapping({1: 0.01, 8: 0.02}), x)
        calls.append(lam.usage().requests)
    finally:
        await lam.close()
    for got in (alone, batched):
        assert np.allclose(np.asarray(got, dtype=np.float32), want, atol=1e-5)
    assert calls[1] - calls[0] == 12  # one invocation per request without a curve
    assert 2 <= calls[2] - calls[1] <= 3  # 12 rows in chunks of at most 8
