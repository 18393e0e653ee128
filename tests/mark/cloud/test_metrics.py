"""CloudWatch metrics put to the moto server and read back with GetMetricStatistics."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from aiobotocore.session import get_session

from mark.cloud.aws.metrics import CloudWatchMetrics, metric_data
from mark.state.records import ArrivalWindow, LatencyRollup

REGION = "us-east-1"


async def test_a_period_is_published_per_model_and_read_back(aws_env: str, cluster: str) -> None:
    now = time.time()
    async with CloudWatchMetrics(
        ["digits", "resnet"], cluster=cluster, region=REGION, endpoint_url=aws_env
    ) as cw:
        cw.observe(
            [ArrivalWindow("digits", now - 10, 5.0, 20), ArrivalWindow("digits", now - 5, 5.0, 40)],
            [LatencyRollup("digits", now - 60, 60, 10.0, 50.0, 90.0, slo_hits=57, slo_misses=3)],
        )
        cw.set_cost_rate({"digits": 0.17, "resnet": 0.0})
        sent = {m.model: m for m in await cw.publish(now)}
        assert sent["digits"].arrival_rate == 6.0 and sent["digits"].slo_attainment == 0.95
        assert sent["resnet"].arrival_rate == 0.0 and sent["resnet"].slo_attainment is None
        # The next period starts empty; the cost rate stands until it is set again.
        (d, _) = cw.take()
        assert d.arrival_rate == 0.0 and d.cost_rate == 0.17

    async with get_session().create_client(
        "cloudwatch", region_name=REGION, endpoint_url=aws_env
    ) as client:

        async def stat(metric: str, model: str) -> list[float]:
            resp = await client.get_metric_statistics(
                Namespace="mark",
                MetricName=metric,
                Dimensions=[
                    {"Name": "Model", "Value": model},
                    {"Name": "Cluster", "Value": cluster},
                ],
                StartTime=datetime.now(UTC) - timedelta(minutes=5),
                EndTime=datetime.now(UTC) + timedelta(minutes=1),
                Period=60,
                Statistics=["Average"],
            )
            return [p["Average"] for p in resp["Datapoints"]]

        assert await stat("ArrivalRate", "digits") == [6.0]
        assert await stat("SLOAttainment", "digits") == [95.0]
        assert await stat("FleetCostRate", "digits") == [0.17]
        assert await stat("ArrivalRate", "resnet") == [0.0]
        assert await stat("SLOAttainment", "resnet") == []


def test_a_frontend_that_does_not_lead_publishes_its_arrivals_but_no_cost() -> None:
    """Every frontend's arrivals add up under the Sum statistic; the fleet's cost is one
    figure for the cluster, so only the leader sends it."""
    stamp = datetime.now(UTC)
    cw = CloudWatchMetrics(["digits"], cluster="c", region=REGION)
    cw.observe([ArrivalWindow("digits", 0.0, 5.0, 20)], [])
    cw.set_cost_rate(None)
    (m,) = cw.take()
    assert m.arrival_rate == 4.0 and m.cost_rate is None
    assert [d["MetricName"] for d in metric_data(m, "c", stamp)] == ["ArrivalRate"]
    cw.set_cost_rate({"digits": 0.17})
    (m,) = cw.take()
    assert [d["MetricName"] for d in metric_data(m, "c", stamp)] == [
        "ArrivalRate",
        "FleetCostRate",
    ]
