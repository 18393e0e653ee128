"""The EC2 side of the ``Fleet`` port, with one long-lived aiobotocore client.

mark only ever touches instances it can prove it owns: every instance (and its
volumes) is tagged at launch with ``mark:cluster`` and mark's own facts about it
(model, role, market), and ``terminate``/``stop``/``start`` describe the ids
first and refuse the whole call with ``NotOwned`` if any id lacks this cluster's
tag. The same tags are what a restarted controller reconciles from (``adopt``);
they and the translation of EC2's descriptions into ``InstanceInfo`` live in
``mark.cloud.aws.instances``.

AWS failures become mark's error types by error *code* (never message text):
no capacity is ``InsufficientCapacity`` (the reconciler falls back to the next
offering), throttling is retried here with jittered back-off and only then
raised as ``Throttled`` (5xx codes and dropped connections likewise), and
anything else is an ``AwsApiError`` carrying the code (the mapping and the
``RetryPolicy`` are in ``mark.cloud.aws.errors``). botocore's own retries
are switched off so this is the only retry layer and its bound is the one
written here.
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiobotocore.config import AioConfig
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from mark.catalog import Market
from mark.clock import WallClock
from mark.cloud.aws.client import OwnedClient
from mark.cloud.aws.errors import TRANSIENT_CODES, AwsApiError, RetryPolicy, map_client_error
from mark.cloud.aws.instances import (
    TAG_CLIENT_TOKEN,
    TAG_CLUSTER,
    check_same_launch,
    ec2_client_token,
    instance_info,
    launch_tags,
    tags_of,
)
from mark.cloud.aws.spot_prices import fetch_spot_quotes, median_newest_by_zone
from mark.errors import CloudError, ConfigError, InsufficientCapacity, NotOwned, Throttled
from mark.ports import Clock, Fleet, InstanceInfo, InterruptionNotice, LaunchRequest

_LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
_FILTER_VALUES_MAX = 200  # EC2's limit on values in one filter


@dataclass(frozen=True, slots=True)
class LaunchTemplateRef:
    """An EC2 launch template (AMI, profile, security groups, user data live in it)."""

    name: str | None = None
    id: str | None = None
    version: str = "$Latest"

    def __post_init__(self) -> None:
        if (self.name is None) == (self.id is None):
            raise ConfigError("a launch template needs exactly one of name or id")

    def params(self) -> dict[str, Any]:
        ref: dict[str, Any] = {"Version": self.version}
        if self.id is not None:
            ref["LaunchTemplateId"] = self.id
        else:
            ref["LaunchTemplateName"] = self.name
        return {"LaunchTemplate": ref}


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """The few launch parameters mark needs when no launch template is configured."""

    image_id: str
    subnet_id: str | None = None
    security_group_ids: Sequence[str] = ()
    iam_instance_profile: str | None = None  # name or ARN
    key_name: str | None = None

    def params(self) -> dict[str, Any]:
        p: dict[str, Any] = {"ImageId": self.image_id}
        if self.subnet_id is not None:
            p["SubnetId"] = self.subnet_id
        if self.security_group_ids:
            p["SecurityGroupIds"] = list(self.security_group_ids)
        if self.iam_instance_profile is not None:
            key = "Arn" if self.iam_instance_profile.startswith("arn:") else "Name"
            p["IamInstanceProfile"] = {key: self.iam_instance_profile}
        if self.key_name is not None:
            p["KeyName"] = self.key_name
        return p


UserData = str | Callable[[LaunchRequest], str] | None


class AwsFleet(OwnedClient):
    """``Fleet`` on EC2. Use as ``async with AwsFleet(...) as fleet`` or ``open()``/``close()``.

    ``client`` lets a unit test hand in a stand-in client; normally the fleet
    creates (and closes) its own aiobotocore EC2 client.
    """

    service = "ec2"
    page_size: int = 500  # DescribeInstances MaxResults (5..1000)

    def __init__(
        self,
        region: str,
        endpoint_url: str | None = None,
        cluster: str = "default",
        launch_template: LaunchTemplateRef | LaunchSpec | None = None,
        *,
        user_data: UserData = None,
        subnet_ids: Sequence[str] = (),
        clock: Clock | None = None,
        retry: RetryPolicy | None = None,
        client: Any = None,
    ) -> None:
        self.region = region
        self.endpoint_url = endpoint_url
        self.cluster = cluster
        self.launch_template = launch_template
        self.user_data = user_data
        self.subnet_ids = tuple(subnet_ids)
        self.clock: Clock = clock if clock is not None else WallClock()
        self.retry = retry if retry is not None else RetryPolicy()
        self._client: Any = client
        self._client_cm: Any = None
        self._notices: asyncio.Queue[InterruptionNotice] = asyncio.Queue()
        self._token_locks: dict[str, tuple[asyncio.Lock, int]] = {}  # lock, users

    # -- lifecycle ---------------------------------------------------------

    def _client_config(self) -> AioConfig:
        # botocore's own retries are off: _call is the one retry layer.
        return AioConfig(retries={"mode": "standard", "total_max_attempts": 1})

    # -- the Fleet port ----------------------------------------------------

    async def launch(
        self, request: LaunchRequest, *, client_token: str | None = None
    ) -> list[InstanceInfo]:
        """Launch exactly ``request.count`` instances, tagged as ours, or none.

        All-or-nothing (MinCount = MaxCount) so a shortfall surfaces as
        ``InsufficientCapacity`` and the reconciler can fall back to the next
        offering, instead of silently getting fewer than it planned for.

        ``client_token`` (or ``request.client_token``) makes the call idempotent:
        a second launch with the same token returns the first one's instances
        (in any state) instead of buying more. It is sent as EC2's
        ``ClientToken`` (scoped to this cluster, since EC2 scopes tokens to the
        account) and also written as a tag that is looked up first, so the
        guarantee holds for a restarted controller and wherever ``ClientToken``
        is not honoured (moto ignores it). Without one, a fresh token still
        makes this call's own throttle retries safe.
        """
        if request.count < 1:
            return []
        token = client_token or request.client_token or uuid.uuid4().hex
        async with self._token_lock(token):
            existing = await self._describe(self._filters({TAG_CLIENT_TOKEN: token}))
            if existing:
                check_same_launch(existing, request, token)
                return existing
            tags = launch_tags(self.cluster, request, token)
            subnets = self._subnet_order(token)
            for k, subnet in enumerate(subnets):
                try:
                    resp = await self._call(
                        "run_instances", **self._run_params(request, token, tags, subnet)
                    )
                except InsufficientCapacity:
                    if k + 1 == len(subnets):
                        raise
                    continue  # another subnet is another Availability Zone's capacity
                return [instance_info(inst, tags) for inst in resp.get("Instances", [])]
            raise AssertionError("unreachable: the loop returns or raises")

    async def terminate(self, instance_ids: Sequence[str]) -> None:
        """Terminate instances this cluster owns; ``NotOwned`` (and nothing done) otherwise."""
        ids = await self._owned(instance_ids)
        if ids:
            await self._call("terminate_instances", InstanceIds=ids)

    async def stop(self, instance_ids: Sequence[str]) -> None:
        """Stop owned instances (burstable standbys); stopped ones cost only their EBS."""
        ids = await self._owned(instance_ids)
        if ids:
            await self._call("stop_instances", InstanceIds=ids)

    async def start(self, instance_ids: Sequence[str]) -> None:
        """Start owned stopped standbys."""
        ids = await self._owned(instance_ids)
        if ids:
            await self._call("start_instances", InstanceIds=ids)

    async def list(self) -> list[InstanceInfo]:
        """Every non-terminated instance carrying this cluster's tag (all pages), oldest first."""
        found = await self._describe(
            [*self._filters({}), {"Name": "instance-state-name", "Values": _LIVE_STATES}]
        )
        return sorted(found, key=lambda i: (i.launched_at, i.instance_id))

    def notify(self, notice: InterruptionNotice) -> None:
        """Hand a notice to whoever iterates ``interruptions()``."""
        self._notices.put_nowait(notice)

    async def interruptions(self) -> AsyncIterator[InterruptionNotice]:
        """Spot interruption and rebalance notices, in arrival order, for one consumer.

        Notices are fed by ``notify``: from the EventBridge -> SQS queue
        (``SqsInterruptionSource(..., sink=fleet.notify)``) and, later, from
        agents polling IMDS, so the controller reads one stream whatever the
        source. A notice may arrive twice (SQS redelivers); acting on it must be
        idempotent.
        """
        while True:
            yield await self._notices.get()

    async def spot_prices(self, instance_types: Sequence[str]) -> dict[str, float]:
        """Median over zones of each zone's newest spot price (``spot_prices`` module)."""
        quotes = await fetch_spot_quotes(
            instance_types, region=self.region, endpoint_url=self.endpoint_url
        )
        return median_newest_by_zone(quotes)

    # -- internals ---------------------------------------------------------

    async def _call(self, operation: str, **kwargs: Any) -> Any:
        """One EC2 call with AWS errors mapped to mark's.

        Throttling, 5xx codes and dropped connections are retried (every call
        here is safe to repeat: describes read, state changes are idempotent,
        and a launch carries its client token); anything else raises at once.
        """
        if self._client is None:
            raise CloudError("AwsFleet is not open: use `async with` or `await open()`")
        method = getattr(self._client, operation)
        for attempt in range(self.retry.attempts):
            last = attempt + 1 >= self.retry.attempts
            try:
                return await method(**kwargs)
            except ClientError as err:
                mapped = map_client_error(err, operation)
                transient = isinstance(mapped, Throttled) or (
                    isinstance(mapped, AwsApiError) and mapped.code in TRANSIENT_CODES
                )
                if last or not transient:
                    raise mapped from err
            except (BotoConnectionError, HTTPClientError) as err:
                if last:
                    raise CloudError(f"{operation}: {err}") from err
            await self.clock.sleep(self.retry.delay(attempt))
        raise AssertionError("unreachable: the loop returns or raises")

    @asynccontextmanager
    async def _token_lock(self, token: str) -> AsyncIterator[None]:
        """Serialise launches sharing a token; forget the lock when its last user leaves."""
        lock, users = self._token_locks.get(token, (asyncio.Lock(), 0))
        self._token_locks[token] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._token_locks[token]
            if users == 1:
                del self._token_locks[token]
            else:
                self._token_locks[token] = (lock, users - 1)

    def _filters(self, tags: Mapping[str, str]) -> builtins.list[dict[str, Any]]:
        wanted = {TAG_CLUSTER: self.cluster, **tags}
        return [{"Name": f"tag:{k}", "Values": [v]} for k, v in wanted.items()]

    async def _describe(
        self, filters: builtins.list[dict[str, Any]]
    ) -> builtins.list[InstanceInfo]:
        out: builtins.list[InstanceInfo] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Filters": filters, "MaxResults": self.page_size}
            if token:
                kwargs["NextToken"] = token
            page = await self._call("describe_instances", **kwargs)
            for reservation in page.get("Reservations", []):
                out.extend(instance_info(inst) for inst in reservation.get("Instances", []))
            token = page.get("NextToken")
            if not token:
                return out

    async def _owned(self, instance_ids: Sequence[str]) -> builtins.list[str]:
        """The ids, de-duplicated, if every one carries this cluster's tag; else ``NotOwned``.

        Filtering by ``instance-id`` (rather than passing ``InstanceIds``) means
        an unknown id is simply absent instead of failing the whole describe.
        """
        ids = list(dict.fromkeys(instance_ids))
        if not ids:
            return []
        seen: dict[str, bool] = {}
        for start in range(0, len(ids), _FILTER_VALUES_MAX):
            chunk = ids[start : start + _FILTER_VALUES_MAX]
            token: str | None = None
            while True:
                kwargs: dict[str, Any] = {"Filters": [{"Name": "instance-id", "Values": chunk}]}
                if token:
                    kwargs["NextToken"] = token
                page = await self._call("describe_instances", **kwargs)
                for reservation in page.get("Reservations", []):
                    for inst in reservation.get("Instances", []):
                        owner = tags_of(inst).get(TAG_CLUSTER)
                        seen[inst["InstanceId"]] = owner == self.cluster
                token = page.get("NextToken")
                if not token:
                    break
        missing = [i for i in ids if i not in seen]
        foreign = [i for i in ids if seen.get(i) is False]
        if missing or foreign:
            raise NotOwned(
                f"cluster {self.cluster!r} does not own {foreign + missing}"
                + (f" ({missing} not found)" if missing else "")
            )
        return ids

    def _subnet_order(self, token: str) -> builtins.list[str | None]:
        """Subnets to try, starting at one fixed by the token: launches spread over the
        zones, and a repeated launch tries the same subnet (and EC2 token) first."""
        if not self.subnet_ids:
            return [None]  # the launch template's network interfaces decide
        n = len(self.subnet_ids)
        first = int(hashlib.sha256(token.encode()).hexdigest(), 16) % n
        return [self.subnet_ids[(first + k) % n] for k in range(n)]

    def _run_params(
        self,
        request: LaunchRequest,
        token: str,
        tags: Mapping[str, str],
        subnet: str | None = None,
    ) -> dict[str, Any]:
        if self.launch_template is None:
            raise ConfigError("AwsFleet needs a launch template or a LaunchSpec to launch")
        tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
        params: dict[str, Any] = {
            **self.launch_template.params(),
            "InstanceType": request.instance_type,
            "MinCount": request.count,
            "MaxCount": request.count,
            # Per subnet: a launch refused in one zone is a different request in the next.
            "ClientToken": ec2_client_token(self.cluster, f"{token}/{subnet or ''}"),
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tag_list},
                {"ResourceType": "volume", "Tags": tag_list},
            ],
        }
        if subnet is not None:
            params["SubnetId"] = subnet
        if request.market is Market.SPOT:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {
                    "SpotInstanceType": "one-time",
                    "InstanceInterruptionBehavior": "terminate",
                },
            }
        user_data = self.user_data(request) if callable(self.user_data) else self.user_data
        if user_data is not None:
            params["UserData"] = user_data  # botocore base64-encodes it
        return params


async def adopt(fleet: Fleet) -> list[InstanceInfo]:
    """What a restarted controller takes over: everything the fleet's tags say it owns.

    Nothing is launched here; the reconciler compares this with the plan, so an
    instance that survived the restart is reused rather than bought twice.
    """
    return await fleet.list()
