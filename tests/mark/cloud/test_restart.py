"""A controller that restarts adopts the fleet it owns by tag and never buys it twice.

The fleet is the real ``AwsFleet`` against the moto server, and the store a real
SQLite file shared by the controller before and after the "crash".
"""

from __future__ import annotations

import builtins
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from bouncer.latency import BatchLatency
from mark.catalog import Market, load_catalog
from mark.cloud.aws.fleet import AwsFleet, LaunchSpec
from mark.cloud.aws.instances import TAG_CLIENT_TOKEN
from mark.config import Settings, load_settings
from mark.control import Controller, build_options
from mark.ports import InstanceInfo, InstanceRole, LaunchRequest
from mark.state import ArrivalWindow, SqlStore, open_store
from provisioner.greedy import PlannerOption

REGION = "us-east-1"


def _setup() -> tuple[Settings, list[PlannerOption]]:
    settings = load_settings(
        overrides={"offerings": {"types": ["c5.large"], "markets": ["on-demand"]}}
    )
    lat = {"c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080})}
    options = build_options(
        settings.models[0], load_catalog(), ["c5.large"], [Market.ON_DEMAND], lat, 90.0
    )
    return settings, options


async def _store_with_load(tmp_path: Path, model: str, rate: float, now: float) -> SqlStore:
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    start = now - 3600
    await store.add_arrivals(
        [ArrivalWindow(model, start + 5 * k, 5.0, int(rate * 5)) for k in range(720)]
    )
    return store


async def _two_instances_of_load(
    tmp_path: Path,
) -> tuple[Settings, list[PlannerOption], str, float, SqlStore]:
    """The setup, its model, now, and a store whose last hour asks for two instances."""
    settings, options = _setup()
    model = settings.models[0].name
    now = time.time()
    store = await _store_with_load(tmp_path, model, 2 * options[0].capacity_rps, now)
    return settings, options, model, now, store


class LaggingFleet:
    """EC2 lists a fresh launch only after a while (DescribeInstances is eventually
    consistent); this wrapper plays that moment: it lists nothing, and launches for real."""

    def __init__(self, fleet: AwsFleet) -> None:
        self.fleet = fleet
        self.launched: list[LaunchRequest] = []

    async def list(self) -> list[InstanceInfo]:
        return []

    async def launch(self, request: LaunchRequest) -> builtins.list[InstanceInfo]:
        self.launched.append(request)
        return await self.fleet.launch(request)

    async def terminate(self, instance_ids: Sequence[str]) -> None:
        await self.fleet.terminate(instance_ids)


async def test_a_restarted_controller_adopts_the_fleet_and_launches_nothing_twice(
    aws_env: str, ami: str, cluster: str, tmp_path: Path
) -> None:
    settings, options = _setup()
    model = settings.models[0].name
    now = time.time()
    # Three times what one instance carries at most, alone or in any pool: at least three.
    most = max([options[0].capacity_rps, *(c for _, c in options[0].pool)])
    store = await _store_with_load(tmp_path, model, 3 * most, now)
    try:
        async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            first = Controller(settings, fleet, store, {model: options})
            (res,) = await first.step(now)
            assert len(res.launched) >= 3
            bought = {i.instance_id for i in res.launched}
            # Each launch carried its decision's token, written on the instances.
            assert all(TAG_CLIENT_TOKEN in i.tags for i in res.launched)

        # The controller crashes; a new one, with a new EC2 client, starts on the same store.
        async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            second = Controller(settings, fleet, store, {model: options})
            adopted = await second.adopt(now + 5)
            assert {i.instance_id for i in adopted} == bought
            recs = {r.instance_id: r for r in await store.instances(model=model)}
            assert set(recs) == bought
            assert any(d.action == "adopt" for d in await store.decisions(0, 1e12))

            (again,) = await second.step(now + 5)  # the same control step, re-run
            assert again.launched == [] and again.retired == []
            assert {i.instance_id for i in await fleet.list()} == bought

            # With no load at all, the adopted fleet is not retired at once: it counts as
            # wanted from adoption, so the cool-down (a start's: they would be stopped
            # into the warm pool) starts afresh.
            await store.close()
            store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/empty.db", upgrade=True)
            third = Controller(settings, fleet, store, {model: options})
            await third.adopt(now + 60)
            (idle,) = await third.step(now + 70)
            assert idle.retired == [] and idle.stopped == [] and idle.held
    finally:
        await store.close()


async def test_a_run_terminated_just_before_a_crash_is_billed_at_the_restart(
    aws_env: str, ami: str, cluster: str, tmp_path: Path
) -> None:
    """The daemon terminates an instance and dies before it bills the run: the restarted
    controller finds it live in the store and gone from EC2, and bills the run from its
    launch to the old controller's last step, once, however often it restarts."""
    settings, options, model, now, store = await _two_instances_of_load(tmp_path)
    try:
        async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            first = Controller(settings, fleet, store, {model: options})
            (res,) = await first.step(now)
            victim, *kept = res.launched
            await first.step(now + 60)  # the last step the old controller plans
            await fleet.terminate([victim.instance_id])  # ... and the crash, before billing
        assert await store.ledger() == []

        for restart in (now + 400, now + 500):
            async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
                adopted = await Controller(settings, fleet, store, {model: options}).adopt(restart)
            assert {i.instance_id for i in adopted} == {i.instance_id for i in kept}
            (entry,) = await store.ledger()
            assert (entry.instance_id, entry.start, entry.end) == (
                victim.instance_id,
                victim.launched_at,
                now + 60,
            )
            # Per second, rounded up, with EC2's 60 s minimum.
            billed = max(60.0, math.ceil(now + 60 - victim.launched_at))
            assert entry.billed_seconds == billed
            assert entry.cost == pytest.approx(entry.unit_price * billed / 3600)
            (rec,) = await store.instances(model=model, states=["terminated"])
            assert rec.instance_id == victim.instance_id
    finally:
        await store.close()


async def test_an_instance_terminated_behind_the_daemons_back_is_ended_and_billed(
    aws_env: str, ami: str, cluster: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A user terminates one of mark's instances by hand while the daemon runs: the next
    step records it terminated, says so in the log, and bills its run up to the last step
    that listed it live, which /metrics counts among the EC2 dollars spent."""
    caplog.set_level(logging.WARNING, logger="mark.control")
    settings, options, model, now, store = await _two_instances_of_load(tmp_path)
    try:
        async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            ctl = Controller(settings, fleet, store, {model: options})
            (res,) = await ctl.step(now)
            victim = res.launched[0]
            await ctl.step(now + 60)  # lists it live
            await fleet.terminate([victim.instance_id])  # by hand, not by mark
            await ctl.step(now + 400)
            await ctl.step(now + 460)  # and again: billed once
        (entry,) = await store.ledger()
        assert (entry.instance_id, entry.start, entry.end) == (
            victim.instance_id,
            victim.launched_at,
            now + 60,
        )
        (rec,) = await store.instances(model=model, states=["terminated"])
        assert rec.instance_id == victim.instance_id
        ended = [r for r in caplog.records if "no longer lists" in r.getMessage()]
        assert len(ended) == 1  # once: the second step finds nothing more to end
        assert victim.instance_id in ended[0].getMessage()
        spent = f'mark_ec2_cost_dollars_total{{model="{model}",market="on-demand"}}'
        (line,) = [x for x in ctl.prometheus().splitlines() if x.startswith(spent)]
        assert float(line.split()[-1]) == pytest.approx(entry.cost, abs=1e-6)
    finally:
        await store.close()


async def test_a_re_run_step_that_cannot_yet_see_its_launch_buys_nothing(
    aws_env: str, ami: str, cluster: str, tmp_path: Path
) -> None:
    """The token is what protects the window in which the cloud does not list new instances."""
    settings, options = _setup()
    model = settings.models[0].name
    # At the start of a control step, so that now + 1 is surely the same step (its token).
    period = settings.timings.update_period_s
    now = (time.time() // period) * period + 1.0
    store = await _store_with_load(tmp_path, model, 3 * options[0].capacity_rps, now)
    try:
        async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            lagging = LaggingFleet(fleet)
            ctl = Controller(settings, lagging, store, {model: options})  # type: ignore[arg-type]
            (res,) = await ctl.step(now)
            bought = {i.instance_id for i in res.launched}
            assert bought

        async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            lagging = LaggingFleet(fleet)
            ctl = Controller(settings, lagging, store, {model: options})  # type: ignore[arg-type]
            (res2,) = await ctl.step(now + 1)  # same step, same (empty) view, same decision
            assert lagging.launched and all(r.client_token for r in lagging.launched)
            assert {i.instance_id for i in res2.launched} == bought  # the first launch, returned
            assert {i.instance_id for i in await fleet.list()} == bought  # nothing bought twice

            # The next control step is a new decision: it may buy (the view still lags).
            (res3,) = await ctl.step(now + settings.timings.update_period_s)
            assert {i.instance_id for i in res3.launched}.isdisjoint(bought)
            # A list that has not caught up with a launch ends nothing, nor bills it.
            recs = {r.instance_id: r for r in await store.instances(model=model)}
            assert all(recs[i].state != "terminated" for i in bought)
            assert await store.ledger() == []
    finally:
        await store.close()


async def test_backups_and_standbys_carry_tokens_too(aws_env: str, ami: str, cluster: str) -> None:
    async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
        req = LaunchRequest(
            "digits", "t3.large", Market.ON_DEMAND, 1, InstanceRole.STANDBY, client_token="x/1"
        )
        a = await fleet.launch(req)
        b = await fleet.launch(req)
        assert [i.instance_id for i in a] == [i.instance_id for i in b]
        assert a[0].tags[TAG_CLIENT_TOKEN] == "x/1"
