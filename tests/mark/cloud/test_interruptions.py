"""Spot interruption and rebalance events reach the fleet's notice stream through SQS (moto)."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest

from mark.clock import ManualClock
from mark.cloud.aws.fleet import AwsFleet
from mark.cloud.aws.interruptions import (
    EVENT_PATTERN,
    INTERRUPTION_WARNING,
    REBALANCE_RECOMMENDATION,
    SqsInterruptionSource,
    parse_event,
)
from mark.ports import InterruptionNotice, NoticeKind

REGION = "us-east-1"
WHEN = datetime(2026, 11, 23, 1, 2, 3, tzinfo=UTC)


def _event(detail_type: str, instance_id: str, **detail: str) -> dict[str, Any]:
    """An EventBridge event as AWS documents it for these two detail types."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": detail_type,
        "source": "aws.ec2",
        "account": "123456789012",
        "time": WHEN.isoformat().replace("+00:00", "Z"),
        "region": REGION,
        "resources": [f"arn:aws:ec2:{REGION}b:instance/{instance_id}"],
        "detail": {"instance-id": instance_id, **detail},
    }


@pytest.fixture
def sqs(aws_env: str) -> Any:
    return boto3.client("sqs", region_name=REGION, endpoint_url=aws_env)


@pytest.fixture
def queue_url(sqs: Any) -> str:
    return str(sqs.create_queue(QueueName=f"mark-int-{uuid.uuid4().hex[:10]}")["QueueUrl"])


def _left(sqs: Any, queue_url: str) -> int:
    attrs = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(
        attrs["ApproximateNumberOfMessagesNotVisible"]
    )


def test_parse_both_event_kinds_and_refuse_the_rest() -> None:
    t = WHEN.timestamp()
    warning = parse_event(
        json.dumps(_event(INTERRUPTION_WARNING, "i-1", **{"instance-action": "terminate"})), 0.0
    )
    assert warning == InterruptionNotice("i-1", NoticeKind.INTERRUPTION, at=t, action_at=t + 120)
    rebalance = parse_event(_event(REBALANCE_RECOMMENDATION, "i-2"), 0.0)
    assert rebalance == InterruptionNotice("i-2", NoticeKind.REBALANCE, at=t)
    via_sns = {
        "Type": "Notification",
        "Message": json.dumps(_event(REBALANCE_RECOMMENDATION, "i-3")),
    }
    assert parse_event(json.dumps(via_sns), 0.0) == InterruptionNotice(
        "i-3", NoticeKind.REBALANCE, at=t
    )
    no_time = {**_event(REBALANCE_RECOMMENDATION, "i-4"), "time": None}
    assert parse_event(no_time, 42.0) == InterruptionNotice("i-4", NoticeKind.REBALANCE, at=42.0)
    for junk in (
        "not json",
        "[]",
        json.dumps({**_event(INTERRUPTION_WARNING, "i-5"), "source": "my.app"}),
        json.dumps(_event("EC2 Instance State-change Notification", "i-6")),
        json.dumps({**_event(INTERRUPTION_WARNING, "i-7"), "detail": {}}),
        json.dumps({"Type": "Notification"}),
    ):
        assert parse_event(junk, 0.0) is None, junk


async def test_a_warning_sent_to_the_queue_reaches_the_fleet_and_is_deleted(
    aws_env: str, sqs: Any, queue_url: str
) -> None:
    sqs.send_message(
        QueueUrl=queue_url,
        MessageBody=json.dumps(
            _event(INTERRUPTION_WARNING, "i-0abc", **{"instance-action": "terminate"})
        ),
    )
    sqs.send_message(
        QueueUrl=queue_url, MessageBody=json.dumps(_event(REBALANCE_RECOMMENDATION, "i-0def"))
    )
    sqs.send_message(QueueUrl=queue_url, MessageBody="hello")  # not ours: dropped
    async with (
        AwsFleet(REGION, aws_env, cluster="int") as fleet,
        SqsInterruptionSource(
            queue_url, fleet.notify, region=REGION, endpoint_url=aws_env, wait_seconds=1
        ) as source,
    ):
        got: list[InterruptionNotice] = []
        for _ in range(5):
            got += await source.poll_once()
            if _left(sqs, queue_url) == 0:
                break
        assert {(n.instance_id, n.kind) for n in got} == {
            ("i-0abc", NoticeKind.INTERRUPTION),
            ("i-0def", NoticeKind.REBALANCE),
        }
        stream = fleet.interruptions()
        streamed = [await anext(stream), await anext(stream)]
        assert sorted(streamed, key=lambda n: n.instance_id) == sorted(
            got, key=lambda n: n.instance_id
        )
    assert _left(sqs, queue_url) == 0


async def test_an_eventbridge_rule_routes_the_warning_through_sqs(
    aws_env: str, sqs: Any, queue_url: str
) -> None:
    """The rule pattern mark deploys selects the warning and the queue delivers it.

    AWS itself refuses PutEvents with an ``aws.*`` source; moto accepts it,
    which is the only way to play AWS's part here.
    """
    events = boto3.client("events", region_name=REGION, endpoint_url=aws_env)
    arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    rule = f"mark-spot-{uuid.uuid4().hex[:8]}"
    events.put_rule(Name=rule, EventPattern=json.dumps(EVENT_PATTERN))
    events.put_targets(Rule=rule, Targets=[{"Id": "q", "Arn": arn}])
    ev = _event(INTERRUPTION_WARNING, "i-0aaa", **{"instance-action": "terminate"})
    events.put_events(
        Entries=[
            {
                "Source": ev["source"],
                "DetailType": ev["detail-type"],
                "Detail": json.dumps(ev["detail"]),
            },
            {
                "Source": "aws.ec2",
                "DetailType": "EC2 Instance State-change Notification",
                "Detail": "{}",
            },
        ]
    )

    received: list[InterruptionNotice] = []
    arrived = asyncio.Event()

    def sink(notice: InterruptionNotice) -> None:
        received.append(notice)
        arrived.set()

    source = SqsInterruptionSource(
        queue_url, sink, region=REGION, endpoint_url=aws_env, wait_seconds=1
    )
    async with source:
        task = asyncio.create_task(source.run())
        try:
            await asyncio.wait_for(arrived.wait(), 10)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    [notice] = received
    assert notice.instance_id == "i-0aaa" and notice.kind is NoticeKind.INTERRUPTION
    assert notice.action_at is not None and notice.action_at - notice.at == 120


async def test_a_refused_notice_stays_in_the_queue(aws_env: str, sqs: Any, queue_url: str) -> None:
    sqs.send_message(
        QueueUrl=queue_url, MessageBody=json.dumps(_event(REBALANCE_RECOMMENDATION, "i-9"))
    )

    def refuse(_: InterruptionNotice) -> None:
        raise RuntimeError("controller busy")

    async with SqsInterruptionSource(
        queue_url, refuse, region=REGION, endpoint_url=aws_env, wait_seconds=1
    ) as source:
        assert await source.poll_once() == []
    assert _left(sqs, queue_url) == 1


class SignallingClock(ManualClock):
    """A manual clock that also says when someone slept on it."""

    def __init__(self) -> None:
        super().__init__()
        self.slept = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.slept.set()
        await super().sleep(seconds)


async def test_run_survives_errors_and_backs_off(aws_env: str) -> None:
    clock = SignallingClock()
    source = SqsInterruptionSource(
        f"{aws_env}/123456789012/no-such-queue",
        lambda _: None,
        region=REGION,
        endpoint_url=aws_env,
        wait_seconds=0,
        clock=clock,
    )
    async with source:
        task = asyncio.create_task(source.run())
        await asyncio.wait_for(clock.slept.wait(), 10)  # failed, backed off, still running
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_frontend_that_does_not_lead_leaves_notices_for_the_leader(
    aws_env: str, sqs: Any
) -> None:
    """Every frontend polls one queue; only the leader acts on a notice, so a follower
    must take none off it: not while idle, and not one its receive got as the lease
    passed (left for SQS to deliver again, here after a 1 s visibility timeout)."""
    queue_url = str(
        sqs.create_queue(
            QueueName=f"mark-int-{uuid.uuid4().hex[:10]}", Attributes={"VisibilityTimeout": "1"}
        )["QueueUrl"]
    )
    sqs.send_message(
        QueueUrl=queue_url, MessageBody=json.dumps(_event(INTERRUPTION_WARNING, "i-7"))
    )
    heard: list[InterruptionNotice] = []
    clock = SignallingClock()
    async with SqsInterruptionSource(
        queue_url, heard.append, region=REGION, endpoint_url=aws_env, wait_seconds=1, clock=clock
    ) as source:
        task = asyncio.create_task(source.run(lambda: False))
        await asyncio.wait_for(clock.slept.wait(), 10)  # idle: it receives nothing
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert heard == [] and _left(sqs, queue_url) == 1
        source.active = lambda: False  # the lease passed while a receive was waiting
        assert await source.poll_once() == []
        assert heard == [] and _left(sqs, queue_url) == 1  # not deleted
        source.active = lambda: True  # it leads again: the message comes back to it
        for _ in range(10):
            if await source.poll_once():
                break
    assert [n.instance_id for n in heard] == ["i-7"] and _left(sqs, queue_url) == 0
