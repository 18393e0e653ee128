"""Against moto: the control loop explores an unprofiled offering type with one instance,
records it as a decision (`mark plan --explain` shows it), and retires it once measured; a
model with no profile at all is explored at its first step and served from the next one,
within the spend rails."""

from __future__ import annotations

import asyncio
import math
import sys
import time
from pathlib import Path

from bouncer.latency import BatchLatency
from mark.catalog import Market, load_catalog
from mark.cloud.aws.fleet import AwsFleet, LaunchSpec
from mark.cloud.aws.world import AwsWorld
from mark.config import load_settings
from mark.control import Controller, build_options
from mark.control.health import HealthTracker
from mark.control.profiles import rate_options
from mark.ports import InstanceRole, InstanceState
from mark.state import ArrivalWindow, ProfileRecord, open_store

REGION = "us-east-1"
C5 = BatchLatency.from_mapping({1: 0.020, 8: 0.080})
M5 = BatchLatency.from_mapping({1: 0.015, 8: 0.060})
LIVE_STATES = (InstanceState.PENDING, InstanceState.RUNNING, InstanceState.READY)


async def test_an_unprofiled_type_is_explored_once_and_retired_once_measured(
    aws_env: str, ami: str, cluster: str, tmp_path: Path
) -> None:
    db_url = f"sqlite+aiosqlite:///{tmp_path}/s.db"
    settings = load_settings(
        overrides={
            "database_url": db_url,
            "offerings": {
                "types": ["c5.large", "m5.large", "inf1.xlarge"],
                "markets": ["on-demand"],
            },
            "planner": {"explore_unprofiled": {"max_concurrent": 1, "interval_s": 600}},
        }
    )
    spec = settings.models[0]
    model = spec.name
    catalog = load_catalog()
    rated = build_options(spec, catalog, ["c5.large"], [Market.ON_DEMAND], {"c5.large": C5}, 30.0)
    now = time.time()
    store = await open_store(db_url, upgrade=True)
    try:
        async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            health = HealthTracker()
            ctl = Controller(
                settings,
                fleet,
                store,
                {model: rated},
                boot_s=30.0,
                profile_sources={model: {"c5.large": "shipped"}},
            )
            ctl.health = health.view
            health.observe(now, [], [])
            await ctl.step(now)
            (explorer,) = [i for i in await fleet.list() if i.role is InstanceRole.EXPLORE]
            # m5.large: no profile rates it; inf1.xlarge the model cannot use (no Neuron artifact).
            assert (explorer.instance_type, explorer.model) == ("m5.large", model)
            (plan,) = await store.plans(model)
            (decision,) = [d for d in plan.decisions if d.action == "explore"]
            assert decision.instance_type == "m5.large" and "no profile rates" in decision.reason

            # Booting: nothing more is explored (one at a time), and it is not retired.
            health.observe(now + 20, [explorer.instance_id], [])
            await ctl.step(now + 20)
            explorers = [i for i in await fleet.list() if i.role is InstanceRole.EXPLORE]
            assert [i.instance_id for i in explorers] == [explorer.instance_id]

            # Its agent reports ready with its profile: stored as measured (the daemon's
            # agent sync), the offerings re-rated, and the next step retires the explorer.
            health.observe(now + 25, [explorer.instance_id], [explorer.instance_id])
            both = build_options(
                spec,
                catalog,
                ["c5.large", "m5.large"],
                [Market.ON_DEMAND],
                {"c5.large": C5, "m5.large": M5},
                30.0,
            )
            await ctl.set_options(
                model,
                both,
                {"c5.large": "shipped", "m5.large": "measured"},
                ctl.standby_capacity.get(model, 0.0),
            )
            await ctl.step(now + 30)
            left = {i.instance_id: i.state for i in await fleet.list()}
            assert left.get(explorer.instance_id) in (
                None,
                InstanceState.SHUTTING_DOWN,
                InstanceState.TERMINATED,
            )
            done = [
                d for d in (await store.plans(model))[0].decisions if d.action == "explore-done"
            ]
            assert [d.instance_id for d in done] == [explorer.instance_id]
            (charge,) = [e for e in await store.ledger() if e.instance_id == explorer.instance_id]
            assert charge.cost > 0
            # Nothing is left to explore: every type the model can use is rated now.
            await ctl.step(now + 700)
            assert not [i for i in await fleet.list() if i.role is InstanceRole.EXPLORE]
    finally:
        await store.close()

    shown = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "mark.cli.main", "--set", f"database_url={db_url}"),
        *("plan", "--explain", "--last", "10"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(shown.communicate(), 120)
    assert shown.returncode == 0, err.decode()
    assert "explore: 1× m5.large/on-demand — no profile rates m5.large" in out.decode()
    assert "explore-done" in out.decode()


def _seeded(spec_name: str, now: float, rate: float) -> list[ArrivalWindow]:
    """An hour of history at ``rate`` requests/s, so a plan with a rated type buys it."""
    return [ArrivalWindow(spec_name, now - 3600 + 5 * k, 5.0, int(rate * 5)) for k in range(720)]


async def test_a_model_with_no_profile_gets_instances_within_a_boot_plus_one_step(
    aws_env: str, ami: str, cluster: str, tmp_path: Path
) -> None:
    """The aws world, default settings: no profile rates any type, so nothing can be planned
    and every request spills. The first step explores the cheapest type at once; its agent's
    profile, stored as measured and rated as the daemon does, makes the next step buy it."""
    db_url = f"sqlite+aiosqlite:///{tmp_path}/s.db"
    settings = load_settings(
        overrides={
            "world": "aws",
            "database_url": db_url,
            "offerings": {"types": ["c5.large", "m5.large"], "markets": ["on-demand"]},
        }
    )
    spec = settings.models[0]
    model = spec.name
    catalog = load_catalog()
    world = AwsWorld(settings, time.time)
    now = time.time()
    store = await open_store(db_url, upgrade=True)
    try:
        await store.add_arrivals(_seeded(model, now, 20.0))
        nothing = await rate_options(settings, spec, world, store, "unused", catalog)
        assert nothing.options == [] and nothing.sources == {}
        async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            health = HealthTracker()
            ctl = Controller(settings, fleet, store, {model: []}, boot_s=30.0, catalog=catalog)
            ctl.health = health.view
            health.observe(now, [], [])
            (first,) = await ctl.step(now)
            assert first.launched == [] and first.error  # nothing rated: all of it spills
            listed = await fleet.list()
            (explorer,) = listed
            assert (explorer.role, explorer.instance_type) == (InstanceRole.EXPLORE, "c5.large")
            (plan,) = await store.plans(model)
            assert plan.explanation["awaiting_profile"] == [["c5.large", True], ["m5.large", False]]
            (why,) = [d for d in plan.decisions if d.action == "explore"]
            assert "interval to the next exploration: none" in why.reason

            # One boot later its agent is ready and reported its profile: the daemon stores
            # it as measured and re-rates the model's offerings (mark.daemon's agent sync).
            health.observe(now + 25, [explorer.instance_id], [explorer.instance_id])
            await store.put_profile(
                ProfileRecord(model, "c5.large", "measured", C5.points, now + 25)
            )
            rated = await rate_options(settings, spec, world, store, "unused", catalog)
            assert rated.sources == {"c5.large": "measured"}
            await ctl.set_options(model, rated.options, rated.sources, rated.standby_capacity_rps)

            # The next step plans c5.large, and retires the explorer.
            (second,) = await ctl.step(now + 30)
            assert second.error is None and second.launched
            assert {(i.role, i.instance_type) for i in second.launched} == {
                (InstanceRole.SERVING, "c5.large")
            }
            left = {i.instance_id: i.state for i in await fleet.list()}
            assert left.get(explorer.instance_id) in (
                None,
                InstanceState.SHUTTING_DOWN,
                InstanceState.TERMINATED,
            )
            newest = (await store.plans(model, limit=1))[0]
            done = [d.instance_id for d in newest.decisions if d.action == "explore-done"]
            assert done == [explorer.instance_id]
            assert ["c5.large/on-demand", "measured"] in [
                [label, src] for label, _, src in newest.explanation["offerings"]
            ]
            # m5.large still awaits its profile; the interval holds it back now (c5 serves).
            assert newest.explanation["awaiting_profile"] == [["m5.large", False]]
            # Inside the rails: every hour of what it bought is below the model's rail.
            running = [i for i in await fleet.list() if i.state in LIVE_STATES]
            assert sum(ctl.price(i.instance_type, i.market.value) for i in running) <= (
                settings.budget.max_hourly_per_model or math.inf
            )
    finally:
        await store.close()
    # What a user reads: the first plan's explorer, and what still awaits a profile.
    plans = await _cli(db_url, "plan", "--explain", "--last", "2")
    assert (
        "awaiting a profile (not planned until measured): c5.large (exploring now), m5.large"
        in plans
    )
    assert "nothing planned: no offering meets the SLO" in plans
    status = await _cli(db_url, "status")
    assert "digits: awaiting a profile (not planned until measured): m5.large" in status


async def _cli(db_url: str, *args: str) -> str:
    """``mark`` run as a user runs it, on this test's store: its output."""
    shown = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "mark.cli.main", "--set", f"database_url={db_url}", *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(shown.communicate(), 120)
    assert shown.returncode == 0, err.decode()
    return out.decode()


async def test_spend_rails_hold_an_exploration_back_and_say_why(
    aws_env: str, ami: str, cluster: str, tmp_path: Path
) -> None:
    """A model rail below the cheapest unprofiled type: nothing is launched, and the plan's
    decisions say exploration is held by the rails and how to measure the type instead."""
    db_url = f"sqlite+aiosqlite:///{tmp_path}/s.db"
    settings = load_settings(
        overrides={
            "world": "aws",
            "database_url": db_url,
            "offerings": {"types": ["c5.large"], "markets": ["on-demand"]},
            "budget": {"max_hourly_per_model": 0.05},  # c5.large is $0.085/h
        }
    )
    model = settings.models[0].name
    now = time.time()
    store = await open_store(db_url, upgrade=True)
    try:
        await store.add_arrivals(_seeded(model, now, 20.0))
        async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            ctl = Controller(settings, fleet, store, {model: []}, boot_s=30.0)
            await ctl.step(now)
            assert await fleet.list() == []
            (plan,) = await store.plans(model)
            actions = {d.action: d for d in plan.decisions}
            assert "explore" not in actions and "spend-rail" in actions
            held = actions["explore-held"]
            assert held.instance_type == "c5.large" and "spend rails" in held.reason
            assert "mark profile --type c5.large" in held.reason
            assert plan.explanation["awaiting_profile"] == [["c5.large", False]]
    finally:
        await store.close()
