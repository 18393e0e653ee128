"""The local world's own start-up duties, without starting moto or any process."""

from __future__ import annotations

from typing import Any

from bouncer.contract import legacy_contract
from mark.catalog import load_catalog
from mark.cloud.local.agents import AgentModel
from mark.cloud.local.world import LocalWorld
from mark.errors import CloudError


class _Spill:
    def __init__(self) -> None:
        self.warmed: list[tuple[str, int]] = []

    async def warm_up(self, model: str, concurrency: int) -> None:
        self.warmed.append((model, concurrency))
        if model == "broken":
            raise CloudError("init failed")


async def test_every_local_lambda_runtime_is_warmed_for_every_model_at_start() -> None:
    """As the aws world warms its function: the first spills must not pay a torch import."""
    model = AgentModel(legacy_contract("m", "m.pt", (1,), "float32"))
    world = LocalWorld(
        "us-east-1",
        load_catalog(),
        {"digits": model, "broken": model},
        lambda: 0.0,
        lambda_concurrency=3,
    )
    spill: Any = _Spill()
    world.serverless = spill
    await world._warm_spill()  # a model that fails to warm is logged, not fatal
    assert sorted(spill.warmed) == [("broken", 3), ("digits", 3)]


def test_local_lambda_runtimes_share_the_cores_instead_of_oversubscribing_them() -> None:
    from mark.cloud.local.world import lambda_threads

    assert lambda_threads(4, cpus=2) == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert lambda_threads(2, cpus=8)["OMP_NUM_THREADS"] == "4"
