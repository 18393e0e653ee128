"""An offering EC2 refuses is avoided and the next one bought, through the real aws adapter.

The fleet is ``AwsFleet`` against the moto server; moto never runs out of
capacity, so RunInstances for spot answers ``SpotMaxPriceTooLow`` here, as EC2
does when the spot price is above the maximum asked.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from bouncer.latency import BatchLatency
from mark.catalog import Market, load_catalog
from mark.cloud.aws.errors import map_client_error
from mark.cloud.aws.fleet import AwsFleet, LaunchSpec
from mark.config import load_settings
from mark.control import Controller, build_options
from mark.state import ArrivalWindow, open_store

REGION = "us-east-1"


class SpotPriceTooLow(AwsFleet):
    async def _call(self, operation: str, **kwargs: Any) -> Any:
        if operation == "run_instances" and "InstanceMarketOptions" in kwargs:
            err = ClientError(
                {"Error": {"Code": "SpotMaxPriceTooLow", "Message": "max price below spot"}},
                "RunInstances",
            )
            raise map_client_error(err, operation)
        return await super()._call(operation, **kwargs)


async def test_spot_refused_falls_back_to_on_demand_in_the_same_step(
    aws_env: str, ami: str, cluster: str, tmp_path: Path
) -> None:
    settings = load_settings(
        overrides={"offerings": {"types": ["c5.large"], "markets": ["spot", "on-demand"]}}
    )
    model = settings.models[0].name
    lat = {"c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080})}
    options = build_options(
        settings.models[0], load_catalog(), ["c5.large"], list(Market), lat, 90.0
    )
    now = time.time()
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        rate = 2 * options[0].capacity_rps
        await store.add_arrivals(
            [ArrivalWindow(model, now - 300 + 5 * k, 5.0, int(rate * 5)) for k in range(60)]
        )
        async with SpotPriceTooLow(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            (res,) = await Controller(settings, fleet, store, {model: options}).step(now)
            assert res.launched and {i.market for i in res.launched} == {Market.ON_DEMAND}
            listed = await fleet.list()
            assert {(i.instance_type, i.market) for i in listed} == {("c5.large", Market.ON_DEMAND)}
        (plan,) = await store.plans(model)
        actions = [(d.action, d.market) for d in plan.decisions]
        assert actions[0] == ("launch-unavailable", "spot")
        assert "SpotMaxPriceTooLow" in plan.decisions[0].reason
        assert ("launch", "on-demand") in actions[1:]
    finally:
        await store.close()
