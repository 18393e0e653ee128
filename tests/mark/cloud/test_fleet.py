"""AwsFleet against a real moto server: launch, tags, list, standbys, ownership, idempotency.

Every test uses its own cluster name, so tests sharing the session's moto
server never see each other's instances. Only the error-mapping unit uses a
stand-in client (to inject AWS error codes moto cannot be made to return).
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from mark.catalog import Market
from mark.clock import ManualClock
from mark.cloud.aws.errors import AwsApiError, RetryPolicy
from mark.cloud.aws.fleet import AwsFleet, LaunchSpec, LaunchTemplateRef, adopt
from mark.cloud.aws.instances import TAG_CLUSTER, TAG_MARKET, TAG_MODEL, TAG_ROLE
from mark.errors import CloudError, ConfigError, InsufficientCapacity, NotOwned, Throttled
from mark.ports import (
    Fleet,
    InstanceRole,
    InstanceState,
    InterruptionNotice,
    LaunchRequest,
    NoticeKind,
)

REGION = "us-east-1"


@pytest.fixture
def ec2(aws_env: str) -> Any:
    """A plain boto3 client: the test's independent view of EC2."""
    return boto3.client("ec2", region_name=REGION, endpoint_url=aws_env)


@pytest.fixture
async def fleet(aws_env: str, ami: str, cluster: str) -> AsyncIterator[AwsFleet]:
    spec = LaunchSpec(image_id=ami)
    async with AwsFleet(
        REGION, aws_env, cluster=cluster, launch_template=spec, user_data="#!/bin/sh\necho agent"
    ) as f:
        yield f


def _instance(ec2: Any, instance_id: str) -> dict[str, Any]:
    inst: dict[str, Any] = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0][
        "Instances"
    ][0]
    return inst


def _tags(obj: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in obj.get("Tags", [])}


async def test_on_demand_and_spot_launch_tagged_and_listed(
    fleet: AwsFleet, ec2: Any, cluster: str
) -> None:
    before = time.time() - 5
    od = await fleet.launch(LaunchRequest("resnet", "c5.large", Market.ON_DEMAND, count=2))
    spot = await fleet.launch(
        LaunchRequest("bert", "m5.large", Market.SPOT, role=InstanceRole.BACKUP)
    )
    assert len(od) == 2 and len(spot) == 1
    assert {i.market for i in od} == {Market.ON_DEMAND} and spot[0].market is Market.SPOT

    # Tags on the instance and on its volumes, seen through a client of our own.
    raw = _instance(ec2, spot[0].instance_id)
    assert raw["InstanceLifecycle"] == "spot"
    tags = _tags(raw)
    assert tags[TAG_CLUSTER] == cluster and tags[TAG_MODEL] == "bert"
    assert tags[TAG_ROLE] == "backup" and tags[TAG_MARKET] == "spot"
    assert tags["Name"] == f"mark-{cluster}-bert-backup"
    vols = ec2.describe_volumes(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}])
    assert len(vols["Volumes"]) == 3
    assert all(_tags(v)[TAG_MODEL] in {"resnet", "bert"} for v in vols["Volumes"])

    # User data passed through (botocore base64-encodes it on the way).
    attr = ec2.describe_instance_attribute(InstanceId=od[0].instance_id, Attribute="userData")
    assert base64.b64decode(attr["UserData"]["Value"]).decode() == "#!/bin/sh\necho agent"

    listed = {i.instance_id: i for i in await fleet.list()}
    assert set(listed) == {i.instance_id for i in od + spot}
    for i in od:
        got = listed[i.instance_id]
        assert (got.model, got.market, got.role) == (
            "resnet",
            Market.ON_DEMAND,
            InstanceRole.SERVING,
        )
        assert got.instance_type == "c5.large"
    got = listed[spot[0].instance_id]
    assert (got.model, got.market, got.role) == ("bert", Market.SPOT, InstanceRole.BACKUP)
    for got in listed.values():
        assert got.state in {InstanceState.PENDING, InstanceState.RUNNING}
        assert got.address and before <= got.launched_at <= time.time() + 5


async def test_launch_through_a_launch_template(
    aws_env: str, ec2: Any, ami: str, cluster: str
) -> None:
    name = f"lt-{cluster}"
    ec2.create_launch_template(
        LaunchTemplateName=name,
        LaunchTemplateData={"ImageId": ami, "UserData": base64.b64encode(b"tmpl").decode()},
    )
    async with AwsFleet(
        REGION, aws_env, cluster=cluster, launch_template=LaunchTemplateRef(name=name)
    ) as fleet:
        [info] = await fleet.launch(LaunchRequest("resnet", "c5.xlarge", Market.ON_DEMAND))
    raw = _instance(ec2, info.instance_id)
    assert raw["ImageId"] == ami and raw["InstanceType"] == "c5.xlarge"
    assert _tags(raw)[TAG_CLUSTER] == cluster


def test_a_launch_template_is_named_by_exactly_one_of_name_or_id() -> None:
    with pytest.raises(ConfigError):
        LaunchTemplateRef()
    with pytest.raises(ConfigError):
        LaunchTemplateRef(name="a", id="lt-1")
    assert LaunchTemplateRef(id="lt-1", version="3").params() == {
        "LaunchTemplate": {"LaunchTemplateId": "lt-1", "Version": "3"}
    }


async def test_without_a_template_or_spec_launch_is_a_config_error(
    aws_env: str, cluster: str
) -> None:
    async with AwsFleet(REGION, aws_env, cluster=cluster) as fleet:
        with pytest.raises(ConfigError):
            await fleet.launch(LaunchRequest("m", "c5.large", Market.ON_DEMAND))


async def test_standby_is_stopped_started_and_terminated(fleet: AwsFleet) -> None:
    [sb] = await fleet.launch(
        LaunchRequest("resnet", "t3.large", Market.ON_DEMAND, role=InstanceRole.STANDBY)
    )
    await fleet.stop([sb.instance_id])
    [got] = await fleet.list()
    assert got.role is InstanceRole.STANDBY
    assert got.state in {InstanceState.STOPPING, InstanceState.STOPPED}

    await fleet.start([sb.instance_id])
    [got] = await fleet.list()
    assert got.state in {InstanceState.PENDING, InstanceState.RUNNING}

    await fleet.terminate([sb.instance_id])
    assert await fleet.list() == []


async def test_instances_mark_does_not_own_are_never_touched(
    fleet: AwsFleet, ec2: Any, ami: str, aws_env: str
) -> None:
    [mine] = await fleet.launch(LaunchRequest("resnet", "c5.large", Market.ON_DEMAND))
    foreign = ec2.run_instances(ImageId=ami, InstanceType="c5.large", MinCount=1, MaxCount=1)
    foreign_id = foreign["Instances"][0]["InstanceId"]
    async with AwsFleet(
        REGION, aws_env, cluster=f"other-{uuid.uuid4().hex[:6]}", launch_template=LaunchSpec(ami)
    ) as other:
        [theirs] = await other.launch(LaunchRequest("resnet", "c5.large", Market.ON_DEMAND))

    for ids in (
        [foreign_id],
        [mine.instance_id, foreign_id],
        [theirs.instance_id],
        ["i-0123456789abcdef0"],
    ):
        for op in (fleet.terminate, fleet.stop, fleet.start):
            with pytest.raises(NotOwned):
                await op(ids)
    # A refused call does nothing at all, not even to the ids it does own.
    for iid in (mine.instance_id, foreign_id, theirs.instance_id):
        assert _instance(ec2, iid)["State"]["Name"] in {"pending", "running"}
    assert [i.instance_id for i in await fleet.list()] == [mine.instance_id]
    ec2.terminate_instances(InstanceIds=[foreign_id, theirs.instance_id])


async def test_same_client_token_never_launches_twice(
    fleet: AwsFleet, aws_env: str, ami: str, cluster: str
) -> None:
    req = LaunchRequest("resnet", "c5.large", Market.SPOT, count=2)
    first = await fleet.launch(req, client_token="plan-7-resnet-c5")
    again = await fleet.launch(req, client_token="plan-7-resnet-c5")
    assert sorted(i.instance_id for i in again) == sorted(i.instance_id for i in first)
    assert len(await fleet.list()) == 2

    # A restarted controller (a new fleet object) adopts them and, retrying
    # the same launch, still buys nothing.
    async with AwsFleet(REGION, aws_env, cluster=cluster, launch_template=LaunchSpec(ami)) as new:
        adopted = await adopt(new)
        assert {i.instance_id for i in adopted} == {i.instance_id for i in first}
        retried = await new.launch(req, client_token="plan-7-resnet-c5")
        assert {i.instance_id for i in retried} == {i.instance_id for i in first}
    assert len(await fleet.list()) == 2

    # Reusing a token for a different launch is refused, as EC2 does.
    with pytest.raises(AwsApiError) as err:
        await fleet.launch(
            LaunchRequest("resnet", "m5.large", Market.SPOT), client_token="plan-7-resnet-c5"
        )
    assert err.value.code == "IdempotentParameterMismatch"


async def test_concurrent_launches_with_one_token_buy_once(fleet: AwsFleet) -> None:
    req = LaunchRequest("resnet", "c5.large", Market.ON_DEMAND)
    a, b = await asyncio.gather(
        fleet.launch(req, client_token="tok"), fleet.launch(req, client_token="tok")
    )
    assert [i.instance_id for i in a] == [i.instance_id for i in b]
    assert len(await fleet.list()) == 1
    assert fleet._token_locks == {}  # a daemon running for months keeps no lock per launch


async def test_list_reads_every_page(fleet: AwsFleet) -> None:
    fleet.page_size = 5
    for _ in range(3):
        await fleet.launch(LaunchRequest("resnet", "c5.large", Market.ON_DEMAND, count=4))
    assert len({i.instance_id for i in await fleet.list()}) == 12


async def test_terminated_instances_are_not_listed(fleet: AwsFleet) -> None:
    infos = await fleet.launch(LaunchRequest("resnet", "c5.large", Market.ON_DEMAND, count=3))
    await fleet.terminate([infos[0].instance_id, infos[0].instance_id])
    assert {i.instance_id for i in await fleet.list()} == {i.instance_id for i in infos[1:]}


async def test_spot_prices_come_from_the_price_history(fleet: AwsFleet) -> None:
    prices = await fleet.spot_prices(["c5.large", "m5.large"])
    assert set(prices) == {"c5.large", "m5.large"} and all(p > 0 for p in prices.values())


async def test_interruption_notices_stream_in_order(fleet: AwsFleet) -> None:
    a = InterruptionNotice("i-1", NoticeKind.REBALANCE, at=1.0)
    b = InterruptionNotice("i-2", NoticeKind.INTERRUPTION, at=2.0, action_at=122.0)
    fleet.notify(a)
    fleet.notify(b)
    stream = fleet.interruptions()
    assert [await anext(stream), await anext(stream)] == [a, b]


async def test_aws_fleet_is_a_fleet(fleet: AwsFleet) -> None:
    as_port: Fleet = fleet
    assert as_port is fleet


# -- error mapping, at the client boundary -----------------------------------


class FakeEc2:
    """Answers DescribeInstances with nothing; fails RunInstances with the given codes/errors."""

    def __init__(self, failures: list[str | Exception]) -> None:
        self.failures = failures
        self.run_calls = 0

    async def describe_instances(self, **_: Any) -> dict[str, Any]:
        return {"Reservations": []}

    async def run_instances(self, **kwargs: Any) -> dict[str, Any]:
        self.run_calls += 1
        if self.failures:
            failure = self.failures.pop(0)
            if isinstance(failure, Exception):
                raise failure
            raise ClientError({"Error": {"Code": failure, "Message": "injected"}}, "RunInstances")
        return {
            "Instances": [
                {
                    "InstanceId": "i-fake",
                    "InstanceType": kwargs["InstanceType"],
                    "State": {"Name": "pending"},
                }
            ]
        }


def _fake_fleet(client: FakeEc2, clock: ManualClock | None = None, attempts: int = 4) -> AwsFleet:
    return AwsFleet(
        REGION,
        cluster="unit",
        launch_template=LaunchSpec("ami-1"),
        clock=clock or ManualClock(),
        retry=RetryPolicy(attempts=attempts, base_s=0.5, cap_s=2.0),
        client=client,
    )


REQ = LaunchRequest("resnet", "c5.large", Market.SPOT)


@pytest.mark.parametrize(
    "code",
    [
        "InsufficientInstanceCapacity",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "InstanceLimitExceeded",
    ],
)
async def test_capacity_errors_are_insufficient_capacity_at_once(code: str) -> None:
    client, clock = FakeEc2([code]), ManualClock()
    with pytest.raises(InsufficientCapacity, match=code):
        await _fake_fleet(client, clock).launch(REQ)
    assert client.run_calls == 1 and clock.now() == 0.0


@pytest.mark.parametrize("code", ["RequestLimitExceeded", "Throttling"])
async def test_throttling_is_retried_with_backoff_then_raised(code: str) -> None:
    client, clock = FakeEc2([code] * 10), ManualClock()
    with pytest.raises(Throttled):
        await _fake_fleet(client, clock, attempts=4).launch(REQ)
    assert client.run_calls == 4
    assert 0.0 <= clock.now() <= 0.5 + 1.0 + 2.0  # full jitter, capped


async def test_a_throttle_that_clears_is_invisible() -> None:
    client, clock = FakeEc2(["RequestLimitExceeded", "Throttling"]), ManualClock()
    [info] = await _fake_fleet(client, clock).launch(REQ)
    assert info.instance_id == "i-fake" and client.run_calls == 3


async def test_server_errors_and_dropped_connections_are_retried() -> None:
    dropped = EndpointConnectionError(endpoint_url="https://ec2.us-east-1.amazonaws.com")
    client = FakeEc2(["InternalError", dropped, "Unavailable"])
    [info] = await _fake_fleet(client).launch(REQ)
    assert info.instance_id == "i-fake" and client.run_calls == 4

    client = FakeEc2([dropped] * 4)
    with pytest.raises(CloudError, match="run_instances") as err:
        await _fake_fleet(client, attempts=4).launch(REQ)
    assert client.run_calls == 4 and isinstance(err.value.__cause__, EndpointConnectionError)

    client = FakeEc2(["InternalError"] * 2)
    with pytest.raises(AwsApiError) as api_err:
        await _fake_fleet(client, attempts=2).launch(REQ)
    assert api_err.value.code == "InternalError"


async def test_other_errors_keep_their_code() -> None:
    client = FakeEc2(["InvalidAMIID.NotFound"])
    with pytest.raises(AwsApiError) as err:
        await _fake_fleet(client, ManualClock()).launch(REQ)
    assert err.value.code == "InvalidAMIID.NotFound" and client.run_calls == 1
    assert isinstance(err.value, CloudError)


async def test_an_unopened_fleet_says_so() -> None:
    with pytest.raises(CloudError, match="not open"):
        await AwsFleet(REGION, launch_template=LaunchSpec("ami-1")).list()


class _ZonalEc2(FakeEc2):
    """No capacity in the first subnet tried; records where each RunInstances went."""

    def __init__(self, full: set[str]) -> None:
        super().__init__([])
        self.full = full
        self.subnets: list[str] = []
        self.tokens: list[str] = []

    async def run_instances(self, **kwargs: Any) -> dict[str, Any]:
        self.subnets.append(kwargs["SubnetId"])
        self.tokens.append(kwargs["ClientToken"])
        if kwargs["SubnetId"] in self.full:
            self.failures = ["InsufficientInstanceCapacity"]
        return await super().run_instances(**kwargs)


async def test_no_capacity_in_one_subnet_tries_the_next_then_gives_up() -> None:
    subnets = ["subnet-a", "subnet-b", "subnet-c"]
    client = _ZonalEc2(full=set())
    fleet = AwsFleet(
        REGION,
        cluster="unit",
        launch_template=LaunchSpec("ami-1"),
        client=client,
        subnet_ids=subnets,
        clock=ManualClock(),
    )
    await fleet.launch(REQ, client_token="tok")
    first = client.subnets[0]

    # The same token starts in the same subnet; a full zone moves on to the next.
    client = _ZonalEc2(full={first})
    fleet._client = client
    [info] = await fleet.launch(REQ, client_token="tok")
    assert info.instance_id == "i-fake" and client.subnets[0] == first
    assert len(client.subnets) == 2 and client.subnets[1] != first
    assert len(set(client.tokens)) == 2 and all(len(t) <= 64 for t in client.tokens)

    client = _ZonalEc2(full=set(subnets))
    fleet._client = client
    with pytest.raises(InsufficientCapacity):
        await fleet.launch(REQ, client_token="tok")
    assert sorted(client.subnets) == subnets


async def test_subnets_given_to_the_fleet_are_where_instances_land(
    aws_env: str, ec2: Any, ami: str, cluster: str
) -> None:
    vpc = ec2.create_vpc(CidrBlock="10.77.0.0/16")["Vpc"]["VpcId"]
    sub = ec2.create_subnet(VpcId=vpc, CidrBlock="10.77.1.0/24")["Subnet"]["SubnetId"]
    async with AwsFleet(
        REGION, aws_env, cluster=cluster, launch_template=LaunchSpec(ami), subnet_ids=[sub]
    ) as fleet:
        [info] = await fleet.launch(LaunchRequest("resnet", "c5.large", Market.ON_DEMAND))
    raw = _instance(ec2, info.instance_id)
    assert raw["SubnetId"] == sub and raw["PrivateIpAddress"].startswith("10.77.1.")
    assert info.address == raw["PrivateIpAddress"]
