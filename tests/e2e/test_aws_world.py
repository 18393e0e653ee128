"""End to end in the aws world: the daemon's AWS code path against a moto server.

The test plays CloudFormation (VPC, subnet, worker launch template, SQS queue,
EventBridge rule: what ``infra/`` creates) and AWS itself, with the stand-ins
for what moto lacks: ``Ec2Host`` boots a real agent for each running instance
at its private address (the subnet is carved from 127.0.0.0/8), each with an
IMDS stand-in, and ``LambdaApi`` serves Lambda Invoke from real awslambdaric
runtimes. The daemon is configured exactly as on AWS plus endpoint URLs.

One run covers the control loop: launch through the template (spot, and a
standby pool), serve requests on the instance and spill to Lambda, restart and
adopt the fleet without buying it twice, an EventBridge interruption warning
through SQS starting the stopped standby (and the agent's IMDS notice of the
same reclaim changing nothing more), the ledger, and CloudWatch metrics.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiobotocore.session import get_session

from bouncer.runner import ModelRunner
from mark.catalog import Market, load_catalog
from mark.cloud.aws.instances import TAG_CLUSTER
from mark.cloud.aws.interruptions import EVENT_PATTERN, INTERRUPTION_WARNING
from mark.cloud.local.agents import AgentModel
from mark.cloud.local.lambda_ import LocalLambda
from mark.cloud.standins.ec2_host import Ec2Host
from mark.cloud.standins.lambda_api import LambdaApi
from mark.cloud.standins.pricing_api import PricingApi
from mark.config import Settings, load_settings
from mark.control import resolve_source
from mark.daemon import Running, start, stop
from mark.demo import load_digits_tensors
from mark.ports import InstanceRole, InstanceState
from mark.state import ArrivalWindow, open_store
from provisioner.batching import PROFILE_BATCHES
from tests.runners import source_runner

REGION = "us-east-1"
FUNCTION = "mark-spill"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


async def _stack(endpoint: str, name: str) -> dict[str, str]:
    """What the CloudFormation stack creates, on moto: its outputs."""
    session = get_session()
    async with session.create_client("ec2", region_name=REGION, endpoint_url=endpoint) as ec2:
        octet = 16 + int(uuid.uuid4().int % 200)
        vpc = (await ec2.create_vpc(CidrBlock=f"127.{octet}.0.0/16"))["Vpc"]["VpcId"]
        subnet = (await ec2.create_subnet(VpcId=vpc, CidrBlock=f"127.{octet}.0.0/24"))["Subnet"]
        images = await ec2.describe_images(
            Owners=["amazon"], Filters=[{"Name": "name", "Values": ["amzn2-ami-hvm-*"]}]
        )
        template = await ec2.create_launch_template(
            LaunchTemplateName=f"{name}-worker",
            LaunchTemplateData={"ImageId": images["Images"][0]["ImageId"]},
        )
    async with session.create_client("sqs", region_name=REGION, endpoint_url=endpoint) as sqs:
        queue = (await sqs.create_queue(QueueName=f"{name}-interruptions"))["QueueUrl"]
        arn = (await sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"]))[
            "Attributes"
        ]["QueueArn"]
    async with session.create_client("events", region_name=REGION, endpoint_url=endpoint) as ev:
        await ev.put_rule(Name=f"{name}-spot", EventPattern=json.dumps(EVENT_PATTERN))
        await ev.put_targets(Rule=f"{name}-spot", Targets=[{"Id": "queue", "Arn": arn}])
    return {
        "WorkerLaunchTemplateId": template["LaunchTemplate"]["LaunchTemplateId"],
        "SubnetId": subnet["SubnetId"],
        "InterruptionQueueUrl": queue,
    }


async def _until(what: str, check: Callable[[], Awaitable[bool]], within: float = 45) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.3)


@pytest.fixture
async def cloud(aws_env: str, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    outputs = await _stack(aws_env, name)
    settings = load_settings(overrides={"data_dir": str(tmp_path)})
    spec = settings.models[0]
    source = resolve_source(spec, tmp_path)  # builds the demo model once
    # The profile a user ships with the model spec (the format `mark profile` writes):
    # this machine's T_b, for the offering and the standby type. No guessed speed is used.
    measured = ModelRunner(spec.contract(source)).profile(PROFILE_BATCHES)
    profile = tmp_path / "digits-profile.json"
    profile.write_text(
        json.dumps(
            [
                {
                    "model": spec.name,
                    "instance_type": t,
                    "batch_latency_s": {str(b): sec for b, sec in measured.points},
                }
                for t in ("c5.large", "t3.large")
            ]
        )
    )
    local = LocalLambda({spec.name: source}, max_concurrency=2, memory_mb=1024)
    await local.start()
    lam = LambdaApi(FUNCTION, local)
    await lam.start()
    # The Pricing API lists c5.large 10 % above the shipped table.
    shipped = load_catalog().on_demand
    pricing = PricingApi({**shipped, "c5.large": round(shipped["c5.large"] * 1.1, 6)})
    await pricing.start()
    port = _free_port()
    host = Ec2Host(
        REGION,
        aws_env,
        outputs["WorkerLaunchTemplateId"],
        port,
        {spec.name: AgentModel(spec.contract(source))},
    )
    await host.start()
    try:
        yield {
            "name": name,
            "outputs": outputs,
            "lambda": lam,
            "pricing": pricing,
            "host": host,
            "port": port,
            "source": source,
            "endpoint": aws_env,
            "profile": profile,
        }
    finally:
        await host.close()
        await lam.close()
        await local.close()
        await pricing.close()


def _settings(cloud: dict[str, Any], tmp_path: Path) -> Settings:
    out = cloud["outputs"]
    settings = load_settings(
        overrides={
            "world": "aws",
            "data_dir": str(tmp_path),
            "api": {"port": 0},
            "aws": {
                "endpoint_url": cloud["endpoint"],
                "cluster": cloud["name"],
                "launch_template_id": out["WorkerLaunchTemplateId"],
                "subnet_ids": [out["SubnetId"]],
                "agent_port": cloud["port"],
                "interruption_queue_url": out["InterruptionQueueUrl"],
                "spill_function": FUNCTION,
                "lambda_endpoint_url": cloud["lambda"].url,
                "pricing_endpoint_url": cloud["pricing"].url,
                "spill_memory_mb": 1024,
                "boot_s": 2,
                "metrics_period_s": 2,
                "spill_warm_every_s": 3,
            },
            "offerings": {
                "types": ["c5.large"],
                "markets": ["spot", "on-demand"],
                "standby_types": ["t3.large"],
            },
            "timings": {"update_period_s": 5, "lead_time_s": 60, "cooldown_s": 600},
            "predictor": {"model": "last"},
        }
    )
    spec = settings.models[0].model_copy(update={"profile": cloud["profile"]})
    return settings.model_copy(update={"models": (spec,)})


async def _seed_load(settings: Settings, rate: float) -> None:
    """An hour of history at ``rate`` requests/s, so the first plan buys capacity."""
    store = await open_store(settings.db_url, upgrade=True)
    try:
        now = time.time()
        name = settings.models[0].name
        await store.add_arrivals(
            [ArrivalWindow(name, now - 3600 + 5 * k, 5.0, int(rate * 5)) for k in range(720)]
        )
    finally:
        await store.close()


async def _cluster_instances(cloud: dict[str, Any]) -> set[str]:
    """What EC2 holds for the cluster (by its tag), not terminated: asked of moto itself."""
    async with get_session().create_client(
        "ec2", region_name=REGION, endpoint_url=cloud["endpoint"]
    ) as ec2:
        got = await ec2.describe_instances(
            Filters=[
                {"Name": f"tag:{TAG_CLUSTER}", "Values": [cloud["name"]]},
                {"Name": "instance-state-name", "Values": ["pending", "running", "stopped"]},
            ]
        )
    return {i["InstanceId"] for r in got["Reservations"] for i in r["Instances"]}


async def _predict(run: Running, images: np.ndarray[Any, Any]) -> list[list[float]]:
    key = {"Authorization": f"Bearer {run.api_key}"}  # the key the daemon made on its store
    async with aiohttp.ClientSession(headers=key) as session:

        async def one(i: int) -> list[float]:
            body = {"instances": [images[i].tolist()]}
            async with session.post(f"{run.url}/v1/models/digits:predict", json=body) as r:
                assert r.status == 200, await r.text()
                return (await r.json())["predictions"][0]  # type: ignore[no-any-return]

        return list(await asyncio.gather(*(one(i) for i in range(len(images)))))


@pytest.mark.slow
async def test_the_aws_world_runs_the_whole_control_loop(
    cloud: dict[str, Any], tmp_path: Path
) -> None:
    settings = _settings(cloud, tmp_path)
    await _seed_load(settings, rate=5.0)
    host: Ec2Host = cloud["host"]
    x, _ = load_digits_tensors()
    images = x[:16].numpy()
    expected = source_runner(cloud["source"]).run(images)

    run = await start(settings)
    try:
        # Before any instance serves, requests spill to Lambda (warmed at start).
        got = await _predict(run, images[:4])
        assert np.allclose(np.asarray(got), expected[:4], atol=1e-4)
        tel = run.models["digits"].telemetry
        assert tel is not None and tel.counts["spilled"] == 4
        fleet = run.world.fleet
        assert fleet is not None and run.controller is not None
        # Prices: on-demand from the Pricing API; moto's constant spot quote is refused.
        prices = run.controller.catalog
        assert prices.offering("c5.large", Market.ON_DEMAND).price_per_hour == round(
            load_catalog().on_demand["c5.large"] * 1.1, 6
        )
        assert prices.spot["c5.large"] == load_catalog().spot["c5.large"]

        # The first step bought spot capacity through the template, and a standby pool.
        async def serving_and_standby_stopped() -> bool:
            listed = await fleet.list()
            standbys = [i for i in listed if i.role is InstanceRole.STANDBY]
            return bool(standbys) and all(i.state is InstanceState.STOPPED for i in standbys)

        await _until("a standby was launched and stopped", serving_and_standby_stopped)
        listed = await fleet.list()
        serving = [i for i in listed if i.role is InstanceRole.SERVING]
        assert serving and {i.market.value for i in serving} == {"spot"}
        assert all(i.address and i.address.startswith("127.") for i in listed)
        dispatcher = run.models["digits"].dispatcher
        assert dispatcher is not None

        async def instance_serves() -> bool:
            return any(i.instance_id in dispatcher.backends for i in serving)

        await _until("the spot instance's agent serves", instance_serves)
        served_before = tel.counts["served"]
        # The agent's Bouncer admits only what it can finish within RT_max by its own
        # profile; on a machine busy with other tests a round may all spill. A few rounds.
        for _ in range(5):
            got = await _predict(run, images)
            assert np.allclose(np.asarray(got), expected, atol=1e-4)
            if tel.counts["served"] > served_before:
                break
            await asyncio.sleep(1.0)
        health = {
            iid: (b.latency.points, b.busy_until - time.time())
            for iid, b in dispatcher.backends.items()
        }
        assert tel.counts["served"] > served_before, f"the instance served nothing: {health}"

        # The agent's own profile is stored as measured on c5.large and rates it from then on.
        async def measured_rates_c5() -> bool:
            stored = await run.store.profiles("digits")
            return any(p.source == "measured" and p.instance_type == "c5.large" for p in stored)

        await _until("the agent's profile was stored", measured_rates_c5)
        # A plan after it rates c5.large by it: waited for, not slept for, since a step
        # on a busy machine may end later than one update period.
        sources: dict[str, str] = {}

        async def a_plan_rates_c5_as_measured() -> bool:
            (plan,) = await run.store.plans("digits", limit=1)
            sources.update({label: src for label, _, src in plan.explanation["offerings"]})
            return sources["c5.large/spot"] == "measured"

        try:
            await _until("a plan rated c5.large as measured", a_plan_rates_c5_as_measured)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the last plan's sources: {sources}") from None
    finally:
        await stop(run)
    bought = await _cluster_instances(cloud)  # all it owned when it stopped

    # Restart: a new daemon adopts the fleet by its tags and buys nothing twice.
    restarted_at = time.time()
    run = await start(settings)
    try:
        new_fleet = run.world.fleet
        assert new_fleet is not None and run.controller is not None
        decisions = await run.store.decisions(0, 1e12)
        assert any(d.action == "adopt" for d in decisions)
        pings = cloud["lambda"].pings

        async def pinged() -> bool:  # by a step of the new daemon
            return bool(cloud["lambda"].pings > pings)

        await _until("the spill function was kept warm", pinged)
        listed = await new_fleet.list()
        now_listed = {i.instance_id for i in listed}
        everything = await run.store.decisions(0, 1e12)
        why = "\n".join(
            f"{d.at:.1f} {d.action} {d.instance_type} {d.instance_id}: {d.reason[:160]}"
            for d in everything
        )
        seen = f"bought {sorted(bought)}, now {sorted(now_listed)}\n{why}"
        assert bought <= now_listed, seen  # all adopted, none lost
        # Nothing bought twice: the adopted spot instance serves, and a standby is launched
        # only for a pool larger than the one adopted (the pool is sized by the rating,
        # which the agent's measured profile, taken on this busy machine, may have raised).
        after = [d for d in everything if d.at >= restarted_at]
        assert not any(d.action == "launch" for d in after), seen
        adopted = sum(
            1 for i in listed if i.instance_id in bought and i.role is InstanceRole.STANDBY
        )
        pools = [int(d.reason.split()[2]) for d in after if d.action == "launch-standby"]
        standbys = sum(1 for i in listed if i.role is InstanceRole.STANDBY)
        assert adopted <= standbys <= max([adopted, *pools]), seen

        # AWS warns that the spot instance will be reclaimed: EventBridge -> SQS -> controller.
        victim = next(i for i in await new_fleet.list() if i.role is InstanceRole.SERVING)
        standby = next(i for i in await new_fleet.list() if i.role is InstanceRole.STANDBY)
        async with get_session().create_client(
            "events", region_name=REGION, endpoint_url=cloud["endpoint"]
        ) as events:
            await events.put_events(
                Entries=[
                    {
                        "Source": "aws.ec2",
                        "DetailType": INTERRUPTION_WARNING,
                        "Detail": json.dumps(
                            {"instance-id": victim.instance_id, "instance-action": "terminate"}
                        ),
                    }
                ]
            )
        new_dispatcher = run.models["digits"].dispatcher
        assert new_dispatcher is not None

        async def standby_serves() -> bool:
            return standby.instance_id in new_dispatcher.backends

        await _until("the started standby serves", standby_serves)
        # The agent on the doomed instance hears the same reclaim from IMDS: no second start.
        host.hosted[victim.instance_id].imds.arm()
        await asyncio.sleep(2.5)
        starts = [d for d in await run.store.decisions(0, 1e12) if d.action == "start-standby"]
        assert len(starts) == 1 and starts[0].instance_id == victim.instance_id
        got = await _predict(run, images)
        assert np.allclose(np.asarray(got), expected, atol=1e-4)

        # The ledger: Lambda spills priced from Lambda's REPORT lines, the reclaimed run priced.
        ledger = await run.store.ledger()
        lam = [e for e in ledger if e.kind == "lambda"]
        assert lam and all(e.cost > 0 and e.gb_seconds > 0 for e in lam)
        ec2 = [e for e in ledger if e.instance_id == victim.instance_id]
        assert len(ec2) == 1 and ec2[0].component == "spot" and ec2[0].cost > 0
    finally:
        await stop(run)

    # CloudWatch has the daemon's metrics for this cluster.
    async with get_session().create_client(
        "cloudwatch", region_name=REGION, endpoint_url=cloud["endpoint"]
    ) as cw:
        stats = await cw.get_metric_statistics(
            Namespace="mark",
            MetricName="ArrivalRate",
            Dimensions=[
                {"Name": "Model", "Value": "digits"},
                {"Name": "Cluster", "Value": cloud["name"]},
            ],
            StartTime=datetime.now(UTC) - timedelta(minutes=10),
            EndTime=datetime.now(UTC) + timedelta(minutes=1),
            Period=60,
            Statistics=["Maximum"],
        )
        assert stats["Datapoints"] and max(p["Maximum"] for p in stats["Datapoints"]) > 0
    # The instances outlive the daemon (a restart adopts them); the host stops their agents.
    assert len(host.child_pids()) >= 1


@pytest.mark.slow
async def test_a_model_with_no_profile_is_profiled_by_mark_and_served(
    cloud: dict[str, Any], tmp_path: Path
) -> None:
    """No profile ships with the model and none is stored, default planner settings: the
    first step explores c5.large (every request spills meanwhile), the explorer's real agent
    reports its profile, which is stored as measured, and a step after it buys c5.large."""
    shipped = _settings(cloud, tmp_path)
    spec = shipped.models[0].model_copy(update={"profile": None})
    offerings = shipped.offerings.model_copy(
        update={"types": ("c5.large",), "markets": (Market.ON_DEMAND,), "standby_types": ()}
    )
    settings = shipped.model_copy(update={"models": (spec,), "offerings": offerings})
    await _seed_load(settings, rate=5.0)
    run = await start(settings)
    try:
        fleet = run.world.fleet
        assert fleet is not None

        async def explored() -> bool:
            return any(i.role is InstanceRole.EXPLORE for i in await fleet.list())

        await _until("an explorer was launched", explored)
        (first,) = await run.store.plans("digits", limit=1)
        assert [d.instance_type for d in first.decisions if d.action == "explore"] == ["c5.large"]

        async def served_by_c5() -> bool:
            return any(
                i.role is InstanceRole.SERVING and i.instance_type == "c5.large"
                for i in await fleet.list()
            )

        await _until("a serving c5.large was bought", served_by_c5, within=60)
        stored = await run.store.profiles("digits")
        assert [(p.instance_type, p.source) for p in stored] == [("c5.large", "measured")]

        async def explorer_retired() -> bool:
            # Recorded as that step ends: after the launch the fleet already lists.
            return any(d.action == "explore-done" for d in await run.store.decisions(0, 1e12))

        await _until("the explorer's retirement was recorded", explorer_retired, within=30)
        decisions = await run.store.decisions(0, 1e12)
        assert not any(d.action in ("spend-rail", "explore-held") for d in decisions)
    finally:
        await stop(run)
