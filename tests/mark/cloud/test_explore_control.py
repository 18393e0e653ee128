"""Against moto: the control loop explores an unprofiled offering type with one instance,
records it as a decision (`mark plan --explain` shows it), and retires it once measured."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from bouncer.latency import BatchLatency
from mark.catalog import Market, load_catalog
from mark.cloud.aws.fleet import AwsFleet, LaunchSpec
from mark.config import load_settings
from mark.control import Controller, build_options
from mark.control.health import HealthTracker
from mark.ports import InstanceRole, InstanceState
from mark.state import open_store

REGION = "us-east-1"
C5 = BatchLatency.from_mapping({1: 0.020, 8: 0.080})
M5 = BatchLatency.from_mapping({1: 0.015, 8: 0.060})


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
