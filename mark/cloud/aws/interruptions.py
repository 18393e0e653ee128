"""Spot interruption warnings and rebalance recommendations, from EventBridge via SQS.

AWS announces a spot reclaim about two minutes ahead as an EventBridge event
("EC2 Spot Instance Interruption Warning"), and earlier, when risk rises, an
"EC2 Instance Rebalance Recommendation". An EventBridge rule forwards both to an
SQS queue (see ``infra/``); ``SqsInterruptionSource`` long-polls that queue and
hands each notice to a sink, normally ``AwsFleet.notify``, so the controller
reads one stream (``Fleet.interruptions()``) whatever the source.

A message is deleted only after the sink took it, so a crash in between means
the notice is delivered again rather than lost (the controller must tolerate a
repeat, which starting an already-started standby does). Messages that are not
one of these two events are deleted and logged: left in place they would come
back forever. Events are account-wide; notices for instances this cluster does
not own pass through, and the controller ignores ids it does not know.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from mark.clock import WallClock
from mark.cloud.aws.client import OwnedClient
from mark.cloud.aws.errors import RetryPolicy, map_client_error
from mark.errors import CloudError
from mark.ports import Clock, InterruptionNotice, NoticeKind

log = logging.getLogger("mark.aws.interruptions")

INTERRUPTION_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE_RECOMMENDATION = "EC2 Instance Rebalance Recommendation"
#: How long AWS gives between the interruption warning and the reclaim.
WARNING_LEAD_S = 120.0
IDLE_POLL_S = 1.0
"""How often a frontend that does not lead looks again whether it does."""

#: The EventBridge event pattern that selects exactly what this module reads.
EVENT_PATTERN: Mapping[str, Any] = {
    "source": ["aws.ec2"],
    "detail-type": [INTERRUPTION_WARNING, REBALANCE_RECOMMENDATION],
}

_KINDS = {
    INTERRUPTION_WARNING: NoticeKind.INTERRUPTION,
    REBALANCE_RECOMMENDATION: NoticeKind.REBALANCE,
}


def parse_event(body: str | Mapping[str, Any], received_at: float) -> InterruptionNotice | None:
    """The notice an SQS message body carries, or ``None`` if it is not one of ours.

    Accepts the EventBridge event itself (what an SQS target receives) or the
    same event wrapped in an SNS notification. The event's ``time`` is when AWS
    sent the warning; the reclaim is ``WARNING_LEAD_S`` later.
    """
    event: Any = body
    try:
        if isinstance(event, str):
            event = json.loads(event)
        if isinstance(event, Mapping) and event.get("Type") == "Notification":
            event = json.loads(event["Message"])  # delivered through SNS
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(event, Mapping) or event.get("source") != "aws.ec2":
        return None
    kind = _KINDS.get(str(event.get("detail-type")))
    detail = event.get("detail")
    if kind is None or not isinstance(detail, Mapping) or not detail.get("instance-id"):
        return None
    at = _timestamp(event.get("time"), received_at)
    return InterruptionNotice(
        instance_id=str(detail["instance-id"]),
        kind=kind,
        at=at,
        action_at=at + WARNING_LEAD_S if kind is NoticeKind.INTERRUPTION else None,
    )


def _timestamp(value: Any, default: float) -> float:
    if not isinstance(value, str):
        return default
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


def _cloud_error(err: Exception, operation: str) -> CloudError:
    """AWS errors by code; transport failures (no code) as a plain ``CloudError``."""
    if isinstance(err, ClientError):
        return map_client_error(err, operation)
    return CloudError(f"{operation}: {err}")


Sink = Callable[[InterruptionNotice], None]


class SqsInterruptionSource(OwnedClient):
    """Long-polls one SQS queue and feeds parsed notices to ``sink``.

    ``poll_once()`` is one receive/handle/delete round (what tests call);
    ``run()`` repeats it until cancelled, backing off on errors instead of
    dying, because a daemon that stops hearing interruptions loses instances
    silently.
    """

    service = "sqs"

    def __init__(
        self,
        queue_url: str,
        sink: Sink,
        *,
        region: str,
        endpoint_url: str | None = None,
        wait_seconds: int = 20,
        clock: Clock | None = None,
        retry: RetryPolicy | None = None,
        client: Any = None,
    ) -> None:
        self.queue_url = queue_url
        self.sink = sink
        self.region = region
        self.endpoint_url = endpoint_url
        self.wait_seconds = wait_seconds
        self.clock: Clock = clock if clock is not None else WallClock()
        self.retry = retry if retry is not None else RetryPolicy()
        self._client: Any = client
        self._client_cm: Any = None
        self.active: Callable[[], bool] | None = None
        """None or yes: notices are handled; no: this frontend does not lead, so what a
        receive already took is left for SQS to deliver again (to the leader)."""

    async def poll_once(self) -> list[InterruptionNotice]:
        """Receive up to 10 messages, hand their notices to the sink, delete them."""
        if self._client is None:
            raise CloudError("SqsInterruptionSource is not open: use `async with` or `open()`")
        try:
            resp = await self._client.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=self.wait_seconds,
            )
        except (ClientError, BotoCoreError) as err:
            raise _cloud_error(err, "receive_message") from err
        if self.active is not None and not self.active():  # the lease passed during the wait
            return []  # not deleted: visible again after the queue's visibility timeout
        notices: list[InterruptionNotice] = []
        done: list[dict[str, str]] = []
        for msg in resp.get("Messages", []):
            notice = parse_event(msg.get("Body", ""), self.clock.now())
            if notice is None:
                log.warning("deleting a message that is not an EC2 interruption event: %.200s", msg)
            else:
                try:
                    self.sink(notice)
                except Exception:  # left in the queue, so SQS delivers it again
                    log.exception("sink refused %s; it will be redelivered", notice)
                    continue
                notices.append(notice)
            done.append({"Id": str(len(done)), "ReceiptHandle": msg["ReceiptHandle"]})
        if done:
            try:
                await self._client.delete_message_batch(QueueUrl=self.queue_url, Entries=done)
            except (ClientError, BotoCoreError) as err:
                raise _cloud_error(err, "delete_message_batch") from err
        return notices

    async def run(self, active: Callable[[], bool] | None = None) -> None:
        """Poll until cancelled; errors are logged and retried after a jittered pause.
        While ``active`` says no, take nothing off the queue (``poll_once``)."""
        self.active = active
        failures = 0
        while True:
            if active is not None and not active():
                await self.clock.sleep(IDLE_POLL_S)
                continue
            try:
                await self.poll_once()
                failures = 0
            except CloudError as err:
                log.warning("interruption queue %s: %s", self.queue_url, err)
                await self.clock.sleep(self.retry.delay(min(failures, 10)))
                failures += 1
