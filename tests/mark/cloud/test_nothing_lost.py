"""Nothing lost in the control plane, through the real aws adapter against moto.

* the orphan sweep terminates a removed model's instances after the grace, and
  never an instance without this cluster's tag (one launched untagged with boto3,
  one tagged by another cluster: both survive);
* a standby start EC2 refuses is retried, by the repeated notice or the next step;
* the control state survives a restart: doomed instances, avoided offerings,
  standby holds and starts owed, the SLO hold-off, orphan clocks.

The store is a real SQLite file or PostgreSQL database (``db_url``: both).
"""

from __future__ import annotations

import time
from typing import Any

import boto3
from botocore.exceptions import ClientError

from bouncer.latency import BatchLatency
from mark.catalog import Market, load_catalog
from mark.cloud.aws.errors import map_client_error
from mark.cloud.aws.fleet import AwsFleet, LaunchSpec
from mark.cloud.aws.instances import TAG_CLUSTER, TAG_MODEL, TAG_ROLE
from mark.config import Settings, load_settings
from mark.control import Controller, build_options
from mark.ports import (
    InstanceRole,
    InstanceState,
    InterruptionNotice,
    LaunchRequest,
    NoticeKind,
)
from mark.state import ArrivalWindow, SqlStore, open_store
from provisioner.greedy import PlannerOption

REGION = "us-east-1"


def _setup(**overrides: Any) -> tuple[Settings, list[PlannerOption]]:
    settings = load_settings(
        overrides={
            "offerings": {
                "types": ["c5.large"],
                "markets": ["on-demand", "spot"],
                "standby_types": ["t3.large"],
            },
            **overrides,
        }
    )
    lat = {"c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080})}
    options = build_options(
        settings.models[0], load_catalog(), ["c5.large"], list(Market), lat, 90.0
    )
    return settings, options


async def _store(url: str, model: str, rate: float, now: float) -> SqlStore:
    store = await open_store(url, upgrade=True)
    await store.add_arrivals(
        [ArrivalWindow(model, now - 3600 + 5 * k, 5.0, int(rate * 5)) for k in range(720)]
    )
    return store


def _ec2(endpoint: str) -> Any:
    return boto3.client("ec2", region_name=REGION, endpoint_url=endpoint)


def _state(ec2: Any, instance_id: str) -> str:
    desc = ec2.describe_instances(InstanceIds=[instance_id])
    return str(desc["Reservations"][0]["Instances"][0]["State"]["Name"])


async def test_a_removed_models_instances_end_after_the_grace_and_untagged_ones_never(
    aws_env: str, ami: str, cluster: str, db_url: str
) -> None:
    settings, options = _setup()
    model = settings.models[0].name
    now = time.time()
    store = await _store(db_url, model, 0.5 * options[0].capacity_rps, now)
    ec2 = _ec2(aws_env)
    # Not ours: one instance with no tags at all, one of another cluster (same model tag).
    untagged = ec2.run_instances(ImageId=ami, InstanceType="c5.large", MinCount=1, MaxCount=1)
    foreign = ec2.run_instances(
        ImageId=ami,
        InstanceType="c5.large",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [
                    {"Key": TAG_CLUSTER, "Value": f"{cluster}-other"},
                    {"Key": TAG_MODEL, "Value": "retired"},
                    {"Key": TAG_ROLE, "Value": "serving"},
                ],
            }
        ],
    )
    not_ours = [
        untagged["Instances"][0]["InstanceId"],
        foreign["Instances"][0]["InstanceId"],
    ]
    try:
        async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            # A model this cluster served before it was taken out of the configuration.
            old = await fleet.launch(
                LaunchRequest("retired", "c5.large", Market.ON_DEMAND, 2, InstanceRole.SERVING)
            )
            old_ids = {i.instance_id for i in old}
            ctl = Controller(settings, fleet, store, {model: options})
            assert ctl.cluster == cluster  # the fleet's tag value
            await ctl.adopt(now)
            some = sorted(old_ids)[0]  # a spot notice for a removed model's instance: ignored
            notice = InterruptionNotice(some, NoticeKind.INTERRUPTION, now, now + 120)
            assert await ctl.on_interruption(notice, now) == []
            await ctl.step(now)
            found = [d for d in await store.decisions(now, now + 1) if d.action == "orphan"]
            assert {d.instance_id for d in found} == old_ids
            assert {d.model for d in found} == {"retired"}
            assert all("not configured any more" in d.reason for d in found)
            assert old_ids <= {i.instance_id for i in await fleet.list()}  # grace: kept

            later = now + settings.control.orphan_grace_s
            await ctl.step(later)
            ended = [d for d in await store.decisions(later, later + 1)]
            assert {d.instance_id for d in ended if d.action == "retire-orphan"} == old_ids
            assert old_ids.isdisjoint(i.instance_id for i in await fleet.list())
            assert {_state(ec2, i) for i in old_ids} <= {"shutting-down", "terminated"}
            billed = {e.instance_id: e for e in await store.ledger(model="retired")}
            assert set(billed) == old_ids and all(e.end == later for e in billed.values())
            assert ctl.state.orphans == {}

        for iid in not_ours:  # never touched, whatever the sweep
            assert _state(ec2, iid) == "running"
    finally:
        ec2.terminate_instances(InstanceIds=not_ours)
        await store.close()


async def test_an_orphan_sweep_with_terminate_orphans_off_only_reports(
    aws_env: str, ami: str, cluster: str, db_url: str
) -> None:
    settings, options = _setup(control={"terminate_orphans": False, "orphan_grace_s": 0})
    model = settings.models[0].name
    now = time.time()
    store = await _store(db_url, model, 0.5 * options[0].capacity_rps, now)
    try:
        async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            old = await fleet.launch(
                LaunchRequest("retired", "c5.large", Market.ON_DEMAND, 1, InstanceRole.SERVING)
            )
            ctl = Controller(settings, fleet, store, {model: options})
            await ctl.step(now)
            await ctl.step(now + 3600)
            assert old[0].instance_id in {i.instance_id for i in await fleet.list()}
            actions = {d.action for d in await store.decisions(now, now + 3601)}
            assert "orphan" in actions and "retire-orphan" not in actions
    finally:
        await store.close()


class RefusesStart(AwsFleet):
    """EC2 refuses to start instances the first ``refusals`` times (e.g. InsufficientInstance
    Capacity for the standby's type, or an instance still stopping). Twice by default: the
    notice's start, and the retry of the re-plan that follows the notice at once."""

    refusals = 2

    async def _call(self, operation: str, **kwargs: Any) -> Any:
        if operation == "start_instances" and self.refusals > 0:
            self.refusals -= 1
            err = ClientError(
                {"Error": {"Code": "IncorrectInstanceState", "Message": "not yet"}},
                "StartInstances",
            )
            raise map_client_error(err, operation)
        return await super()._call(operation, **kwargs)


async def _spot_and_standby(fleet: AwsFleet, model: str) -> tuple[str, str]:
    victim = await fleet.launch(
        LaunchRequest(model, "c5.large", Market.SPOT, 1, InstanceRole.SERVING)
    )
    standby = await fleet.launch(
        LaunchRequest(model, "t3.large", Market.ON_DEMAND, 1, InstanceRole.STANDBY)
    )
    await fleet.stop([standby[0].instance_id])
    return victim[0].instance_id, standby[0].instance_id


async def test_a_refused_standby_start_is_retried_by_the_repeated_notice(
    aws_env: str, ami: str, cluster: str, db_url: str
) -> None:
    settings, options = _setup()
    model = settings.models[0].name
    now = time.time()
    store = await _store(db_url, model, 0.5 * options[0].capacity_rps, now)
    try:
        async with RefusesStart(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            victim, standby = await _spot_and_standby(fleet, model)
            ctl = Controller(
                settings, fleet, store, {model: options}, standby_capacity={model: 40.0}
            )
            await ctl.adopt(now)
            notice = InterruptionNotice(victim, NoticeKind.INTERRUPTION, now, now + 120)
            assert await ctl.on_interruption(notice, now) == []  # EC2 refused, twice
            assert fleet.refusals == 0
            # The notice is remembered all the same: doomed, avoided, and the start owed.
            assert victim in ctl.state.doomed and victim in ctl.state.pending_starts
            assert ("c5.large", "spot") in ctl.state.avoid.avoid_until
            actions = [d.action for d in await store.decisions(now, now + 1)]
            assert "start-standby-failed" in actions and "start-standby" in actions

            assert await ctl.on_interruption(notice, now + 5) == [standby]  # the repeat retries
            assert ctl.state.pending_starts == {}
            listed = {i.instance_id: i.state for i in await fleet.list()}
            assert listed[standby] in {InstanceState.PENDING, InstanceState.RUNNING}
            assert await ctl.on_interruption(notice, now + 6) == []  # nothing owed any more
            billed = [e for e in await store.ledger() if e.instance_id == victim]
            assert len(billed) == 1 and billed[0].end == now + 120  # billed once
    finally:
        await store.close()


async def test_a_refused_standby_start_is_retried_by_the_next_step_and_survives_a_restart(
    aws_env: str, ami: str, cluster: str, db_url: str
) -> None:
    settings, options = _setup()
    model = settings.models[0].name
    now = time.time()
    store = await _store(db_url, model, 0.5 * options[0].capacity_rps, now)
    try:
        async with RefusesStart(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            victim, standby = await _spot_and_standby(fleet, model)
            first = Controller(
                settings, fleet, store, {model: options}, standby_capacity={model: 40.0}
            )
            await first.adopt(now)
            notice = InterruptionNotice(victim, NoticeKind.INTERRUPTION, now, now + 120)
            assert await first.on_interruption(notice, now) == []  # refused; no repeat comes
            assert fleet.refusals == 0 and victim in first.state.pending_starts
            # A backup streak: the SLO monitor's hold-off is state a restart must keep too.
            assert await first.check_slo(now + 1, {model: [10.0] * 100})
            kept = first.state

        # The daemon restarts before the next step: a new controller, a new EC2 client.
        async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            second = Controller(
                settings, fleet, store, {model: options}, standby_capacity={model: 40.0}
            )
            await second.adopt(now + 10)
            assert second.state.doomed == kept.doomed == {victim: now + 120}
            assert second.state.pending_starts == kept.pending_starts
            assert second.state.avoid == kept.avoid
            mine, before = second.state.of(model), kept.of(model)
            assert mine.hold_standbys_until == before.hold_standbys_until == now + 120 + 90
            assert mine.slo.holdoff_until == before.slo.holdoff_until > now + 10

            (res,) = await second.step(now + 10)  # the next step starts the owed standby
            assert second.state.pending_starts == {}
            listed = {i.instance_id: i for i in await fleet.list()}
            assert listed[standby].state in {InstanceState.PENDING, InstanceState.RUNNING}
            # planned without the doomed instance, and not on the avoided offering
            assert all(
                (i.instance_type, i.market) != ("c5.large", Market.SPOT) for i in res.launched
            )
            # the SLO hold-off still holds the fleet: nothing retired
            assert res.retired == []
    finally:
        await store.close()


class RefusesLaunch(AwsFleet):
    """EC2 refuses every launch with an error that is not about capacity."""

    async def _call(self, operation: str, **kwargs: Any) -> Any:
        if operation == "run_instances":
            err = ClientError(
                {"Error": {"Code": "UnauthorizedOperation", "Message": "no"}}, "RunInstances"
            )
            raise map_client_error(err, operation)
        return await super()._call(operation, **kwargs)


async def test_retirements_wait_when_a_launch_fails_for_any_reason(
    aws_env: str, ami: str, cluster: str, sqlite_url: str
) -> None:
    settings, _ = _setup(offerings={"types": ["c5.large", "c5.xlarge"], "markets": ["on-demand"]})
    model = settings.models[0].name
    lat = {"c5.xlarge": BatchLatency.from_mapping({1: 0.012, 8: 0.045})}
    # Only c5.xlarge is planned now: the running c5.large instances are surplus.
    options = build_options(
        settings.models[0], load_catalog(), ["c5.xlarge"], [Market.ON_DEMAND], lat, 90.0
    )
    now = time.time()
    store = await _store(sqlite_url, model, 0.5 * options[0].capacity_rps, now)
    try:
        async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            old = await fleet.launch(
                LaunchRequest(model, "c5.large", Market.ON_DEMAND, 2, InstanceRole.SERVING)
            )
        later = now + 600  # past the cool-down and the billing minimum
        async with RefusesLaunch(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            ctl = Controller(settings, fleet, store, {model: options})
            (res,) = await ctl.step(later)
            assert res.launched == [] and res.retired == []
            (plan,) = await store.plans(model, limit=1)
            actions = [d.action for d in plan.decisions]
            assert "launch-failed" in actions and "retire-held" in actions
            assert {i.instance_id for i in old} <= {i.instance_id for i in await fleet.list()}
        async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            ctl = Controller(settings, fleet, store, {model: options})
            (res,) = await ctl.step(later + 60)  # the launch goes out: now they retire
            assert res.launched and res.retired == []
            assert set(res.stopped) == {i.instance_id for i in old}  # into the warm pool
    finally:
        await store.close()
