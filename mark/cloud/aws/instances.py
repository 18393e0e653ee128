"""mark's tags on EC2 instances, and an EC2 instance description as mark's record.

Every instance (and its volumes) is tagged at launch with ``mark:cluster`` and
mark's own facts about it (model, role, market, launch token); ``instance_info``
reads them back into an ``InstanceInfo``, which is what a restarted controller
reconciles from.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from mark.catalog import Market
from mark.cloud.aws.errors import AwsApiError
from mark.ports import InstanceInfo, InstanceRole, InstanceState, LaunchRequest

TAG_CLUSTER = "mark:cluster"
TAG_MODEL = "mark:model"
TAG_ROLE = "mark:role"
TAG_MARKET = "mark:market"
TAG_CLIENT_TOKEN = "mark:client-token"
TAG_VERSION = "mark:version"
"""The model version an instance serves: its agent fetches that version at boot."""


def launch_tags(cluster: str, request: LaunchRequest, token: str) -> dict[str, str]:
    """The tags a launch writes on its instances and their volumes."""
    tags = {
        "Name": f"mark-{cluster}-{request.model}-{request.role.value}",
        TAG_CLUSTER: cluster,
        TAG_MODEL: request.model,
        TAG_ROLE: request.role.value,
        TAG_MARKET: request.market.value,
        TAG_CLIENT_TOKEN: token,
    }
    if request.version is not None:
        tags[TAG_VERSION] = request.version
    return tags


def ec2_client_token(cluster: str, token: str) -> str:
    """EC2's ``ClientToken`` for a launch token: at most 64 ASCII characters, and
    distinct per cluster, because EC2 deduplicates tokens across the whole account."""
    return hashlib.sha256(f"{cluster}/{token}".encode()).hexdigest()[:64]


def tags_of(inst: Mapping[str, Any]) -> dict[str, str]:
    """An EC2 instance description's tags as a plain mapping."""
    return {str(t["Key"]): str(t["Value"]) for t in inst.get("Tags", [])}


def instance_info(
    inst: Mapping[str, Any], known_tags: Mapping[str, str] | None = None
) -> InstanceInfo:
    """An EC2 instance description as mark's record; ``known_tags`` fill in what a
    RunInstances response may omit."""
    tags = {**(known_tags or {}), **tags_of(inst)}
    launched = inst.get("LaunchTime")
    try:
        role = InstanceRole(tags.get(TAG_ROLE, InstanceRole.SERVING.value))
    except ValueError:
        role = InstanceRole.SERVING
    return InstanceInfo(
        instance_id=str(inst["InstanceId"]),
        model=tags.get(TAG_MODEL, ""),
        instance_type=str(inst["InstanceType"]),
        # The instance-lifecycle filter is not portable (moto raises on it), and
        # the field is the truth anyway, so the market is read from it.
        market=Market.SPOT if inst.get("InstanceLifecycle") == "spot" else Market.ON_DEMAND,
        state=InstanceState(inst["State"]["Name"]),
        role=role,
        launched_at=launched.timestamp() if isinstance(launched, datetime) else 0.0,
        address=inst.get("PrivateIpAddress") or inst.get("PublicDnsName") or None,
        tags=tags,
        version=tags.get(TAG_VERSION),
    )


def check_same_launch(existing: Sequence[InstanceInfo], request: LaunchRequest, token: str) -> None:
    """A reused token must mean the same launch, as EC2's ``IdempotentParameterMismatch`` says."""
    for info in existing:
        if (info.model, info.instance_type, info.market, info.role) != (
            request.model,
            request.instance_type,
            request.market,
            request.role,
        ):
            raise AwsApiError(
                "run_instances",
                "IdempotentParameterMismatch",
                f"client token {token!r} was used for a different launch ({info.instance_id})",
            )
