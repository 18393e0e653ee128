"""The local Lambda end to end: real awslambdaric processes against our Runtime API server."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

from mark.catalog import load_catalog
from mark.cloud.local import LocalLambda
from mark.errors import SpillFunctionError, SpillRejected
from mark.ports import Serverless, SpillResult

pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script` is deprecated:DeprecationWarning"
)

MLP = "tests.lambda_rt.fixtures_model:tiny_mlp"


def _batches(count: int, seed: int) -> list[list[list[float]]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1 + i % 3, 4, generator=gen).tolist() for i in range(count)]


def _assert_matches(result: SpillResult, model: torch.nn.Module, batch: list[list[float]]) -> None:
    with torch.inference_mode():
        want = model(torch.tensor(batch))
    assert torch.allclose(torch.tensor(result.outputs), want, atol=1e-6)


async def test_pool_cold_starts_warm_reuse_queueing_and_billing(
    project_root: Path,
    fixture_models: ModuleType,
    runtime_children: Callable[[], list[int]],
    tmp_path: Path,
) -> None:
    mlp = fixture_models.tiny_mlp().eval()
    torch.manual_seed(3)
    scripted_model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Sigmoid()).eval()
    scripted_path = tmp_path / "scripted.pt"
    torch.jit.script(scripted_model).save(str(scripted_path))  # type: ignore[no-untyped-call]

    lam = LocalLambda(
        {"mlp": MLP, "scripted": str(scripted_path)},
        cwd=project_root,
        memory_mb=1024,
        max_concurrency=3,
    )
    port: Serverless = lam
    await lam.start()
    try:
        # Two at once with nothing warm: two runtimes start, both invocations are cold.
        b = _batches(2, seed=1)
        cold = await asyncio.gather(*(port.invoke("mlp", x) for x in b))
        for r, x in zip(cold, b, strict=True):
            _assert_matches(r, mlp, x)
            assert r.cold_start and r.memory_mb == 1024
            assert r.billed_ms > math.ceil(r.duration_ms)  # the init (a torch import) is billed
        assert (lam.cold_starts, lam.runtimes) == (2, 2)

        # The same again: both runtimes are reused warm.
        warm = await asyncio.gather(*(port.invoke("mlp", x) for x in b))
        assert not any(r.cold_start for r in warm)
        assert lam.cold_starts == 2

        # Warming up to 3 pings the two idle runtimes and starts exactly one more.
        await port.warm_up("mlp", 3)
        assert (lam.cold_starts, lam.runtimes) == (3, 3)

        # A burst over the limit queues for the three warm runtimes; none cold-starts.
        before = lam.usage()
        burst_in = _batches(7, seed=2)
        burst = await asyncio.gather(*(port.invoke("mlp", x) for x in burst_in))
        for r, x in zip(burst, burst_in, strict=True):
            _assert_matches(r, mlp, x)
            assert not r.cold_start
        assert (lam.cold_starts, lam.runtimes) == (3, 3)

        # Billing by hand: ms rounded up per invocation, × 1 GB, plus the request fee.
        after = lam.usage()
        prices = load_catalog().lambda_prices
        billed = [math.ceil(r.duration_ms) for r in burst]
        assert [r.billed_ms for r in burst] == billed
        gb_s = sum(billed) / 1000.0 * 1024 / 1024
        assert after.requests - before.requests == 7
        assert after.billed_ms - before.billed_ms == sum(billed)
        assert after.gb_seconds - before.gb_seconds == pytest.approx(gb_s, rel=1e-12)
        assert after.cost - before.cost == pytest.approx(
            gb_s * prices.per_gb_second_x86 + 7 * prices.per_million_requests / 1e6, rel=1e-9
        )

        # A TorchScript file: loaded on first use by a warm runtime (the model's cold start).
        x = _batches(1, seed=4)[0]
        r = await port.invoke("scripted", x)
        _assert_matches(r, scripted_model, x)
        assert r.cold_start and lam.cold_starts == 3

        # The ledger's view: everything so far, per model, once.
        total = lam.usage()
        charges = {c.model: c for c in lam.take_charges()}
        assert set(charges) == {"mlp", "scripted"}
        assert sum(c.requests for c in charges.values()) == total.requests == 2 + 2 + 3 + 7 + 1
        assert sum(c.cost for c in charges.values()) == pytest.approx(total.cost, rel=1e-12)
        assert charges["scripted"].gb_seconds == pytest.approx(r.billed_ms / 1000.0)
        assert lam.take_charges() == []

        pids = lam.child_pids()
        assert len(pids) == 3 and set(pids) == set(runtime_children())
    finally:
        await lam.close()
    assert lam.child_pids() == [] and runtime_children() == []


async def test_handler_errors_come_back_as_explicit_errors(
    project_root: Path, fixture_models: ModuleType
) -> None:
    models = {
        "mlp": MLP,
        "boom": "tests.lambda_rt.fixtures_model:exploding",
        "junk": "tests.lambda_rt.fixtures_model:not_a_module",
    }
    async with LocalLambda(models, cwd=project_root, memory_mb=1024, max_concurrency=1) as lam:
        t0 = time.perf_counter()
        with pytest.raises(SpillFunctionError) as err:
            await lam.invoke("boom", [[1.0], [2.0]])
        assert err.value.error_type == "FixtureFault"
        assert "exploded on a batch of 2" in str(err.value)
        assert any("fixtures_model.py" in line for line in err.value.stack)
        with pytest.raises(SpillRejected, match=r"cannot run this batch \(shape \[1, 2\]\)"):
            await lam.invoke("mlp", [[1.0, 2.0]])
        with pytest.raises(SpillRejected, match="has no contract or source"):
            await lam.invoke("unconfigured", [[1.0]])
        with pytest.raises(SpillRejected, match=r"returned dict, not a torch\.nn\.Module"):
            await lam.invoke("junk", [[1.0]])
        x = _batches(1, seed=5)[0]
        _assert_matches(await lam.invoke("mlp", x), fixture_models.tiny_mlp().eval(), x)
        assert time.perf_counter() - t0 < 30
        # The same runtime survived every error; only the raised one counts as a function error.
        assert lam.cold_starts == 1
        assert (lam.usage().requests, lam.usage().errors) == (5, 1)
