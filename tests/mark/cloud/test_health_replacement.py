"""Against moto: an instance whose agent never reports ready is terminated and replaced,
and one that served and then failed its probe is replaced too; each is a decision."""

from __future__ import annotations

import time
from pathlib import Path

from bouncer.latency import BatchLatency
from mark.catalog import Market, load_catalog
from mark.cloud.aws.fleet import AwsFleet, LaunchSpec
from mark.config import load_settings
from mark.control import Controller, build_options
from mark.control.health import HealthTracker
from mark.ports import InstanceState
from mark.state import ArrivalWindow, open_store

REGION = "us-east-1"
GONE = (InstanceState.SHUTTING_DOWN, InstanceState.TERMINATED)


async def _state(fleet: AwsFleet, iid: str) -> InstanceState | None:
    return next((i.state for i in await fleet.list() if i.instance_id == iid), None)


async def test_never_ready_then_failing_instances_are_replaced(
    aws_env: str, ami: str, cluster: str, tmp_path: Path
) -> None:
    settings = load_settings(
        overrides={
            "offerings": {"types": ["c5.large", "c5.xlarge"], "markets": ["on-demand"]},
            "timings": {"boot_deadline_s": 100, "unhealthy_after_s": 20},
        }
    )
    lat = {
        "c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080}),
        "c5.xlarge": BatchLatency.from_mapping({1: 0.012, 8: 0.045}),
    }
    options = build_options(
        settings.models[0], load_catalog(), ["c5.large", "c5.xlarge"], [Market.ON_DEMAND], lat, 30.0
    )
    model = settings.models[0].name
    now = time.time()
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    rate = 0.5 * min(o.capacity_rps for o in options)  # one instance of either type
    await store.add_arrivals(
        [ArrivalWindow(model, now - 3600 + 5 * k, 5.0, int(rate * 5)) for k in range(720)]
    )
    try:
        async with AwsFleet(REGION, aws_env, cluster, LaunchSpec(ami)) as fleet:
            health = HealthTracker()
            ctl = Controller(settings, fleet, store, {model: options}, boot_s=30.0)
            ctl.health = health.view
            health.observe(now, [], [])
            (first,) = await ctl.step(now)
            (bought,) = first.launched
            # Its agent never answers: at the boot deadline it is terminated and replaced,
            # and its offering avoided, so the replacement is of the other type.
            listed = [i.instance_id for i in await fleet.list()]
            health.observe(now + 50, listed, [])
            (mid,) = await ctl.step(now + 50)
            assert mid.launched == []  # still within its deadline
            health.observe(
                now + 115, listed, []
            )  # 15 s of slack: moto stamps launches in real time
            (late,) = await ctl.step(now + 115)
            assert await _state(fleet, bought.instance_id) in (None, *GONE)
            (replacement,) = late.launched
            assert replacement.instance_type != bought.instance_type
            rows = [d for d in await store.decisions(0, 1e12) if d.action == "replace-unhealthy"]
            assert [d.instance_id for d in rows] == [bought.instance_id]
            assert "boot deadline" in rows[0].reason
            billed = [e for e in await store.ledger() if e.instance_id == bought.instance_id]
            assert len(billed) == 1

            # The replacement serves, then fails its probe: replaced once the limit passes.
            rid = replacement.instance_id
            health.observe(now + 130, [rid], [rid])
            (ok,) = await ctl.step(now + 130)
            assert ok.launched == []
            health.observe(now + 140, [rid], [])  # failing from here
            (soon,) = await ctl.step(now + 150)
            # A failing instance is not capacity: its load is bought again at once ...
            assert soon.launched and all(i.instance_id != rid for i in soon.launched)
            fresh = [i.instance_id for i in soon.launched]
            assert await _state(fleet, rid) is InstanceState.RUNNING  # ... not yet retired
            health.observe(now + 161, [rid, *fresh], fresh)
            await ctl.step(now + 161)
            assert await _state(fleet, rid) in (None, *GONE)
            rows = [d for d in await store.decisions(0, 1e12) if d.action == "replace-unhealthy"]
            assert rows[-1].instance_id == rid and "liveness" in rows[-1].reason
    finally:
        await store.close()
