"""Two control tasks at once (a step and a spot notice) act one after the other.

The daemon runs the periodic step, the SLO monitor and the spot-notice handler
as separate tasks. Each awaits the cloud between reading the fleet and acting
on it; without one writer, a step and a notice that both find the same surplus
instance both retire and bill it. Here every fleet call yields to the event
loop and a termination takes 0.1 s, so two tasks that can interleave do.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from bouncer.latency import BatchLatency
from mark.catalog import Market, load_catalog
from mark.clock import ManualClock
from mark.config import load_settings
from mark.control import Controller, build_options
from mark.ports import InstanceInfo, InstanceRole, InterruptionNotice, LaunchRequest, NoticeKind
from mark.sim.fleet import SimFleet
from mark.state import ArrivalWindow, open_store

T0 = 1_700_000_000.0


class SlowFleet(SimFleet):
    """A simulated fleet whose calls take time, as a cloud API's do: a termination is
    acknowledged 0.1 s after it is asked for, and every call yields to other tasks."""

    terminated: Counter[str]

    async def list(self) -> list[InstanceInfo]:
        await asyncio.sleep(0)
        return await super().list()

    async def terminate(self, instance_ids: Sequence[str]) -> None:
        self.terminated.update(instance_ids)
        await asyncio.sleep(0.1)
        await super().terminate(instance_ids)


async def test_a_step_and_an_interruption_never_retire_or_bill_an_instance_twice(
    tmp_path: Path,
) -> None:
    settings = load_settings(
        overrides={
            "offerings": {"types": ["c5.large"], "markets": ["on-demand", "spot"]},
            "timings": {"cooldown_s": 0, "billing_minimum_s": 0},
        }
    )
    spec = settings.models[0]
    catalog = load_catalog()
    lat = {"c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080})}
    options = build_options(spec, catalog, ["c5.large"], settings.offerings.markets, lat, 60.0)
    clock = ManualClock(T0)
    fleet = SlowFleet(catalog, clock.now, boot_delay_s=lambda _t: 0.0)
    fleet.terminated = Counter()
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        # Four spot instances, a load that needs one: three are surplus, past any cool-down.
        got = await fleet.launch(
            LaunchRequest(spec.name, "c5.large", Market.SPOT, 4, InstanceRole.SERVING)
        )
        clock.advance(600)
        await store.add_arrivals(
            [ArrivalWindow(spec.name, clock.now() - 600 + 5 * k, 5.0, 5) for k in range(120)]
        )
        ctl = Controller(settings, fleet, store, {spec.name: options}, boot_s=0.0)
        notice = InterruptionNotice(
            got[0].instance_id, NoticeKind.INTERRUPTION, clock.now(), clock.now() + 120
        )
        await asyncio.gather(ctl.step(clock.now()), ctl.on_interruption(notice, clock.now()))
        assert fleet.terminated, "the surplus was retired"
        assert max(fleet.terminated.values()) == 1, fleet.terminated
        billed = Counter(e.instance_id for e in await store.ledger())
        assert billed and max(billed.values()) == 1, billed
        retire_rows = Counter(
            d.instance_id for d in await store.decisions(0, 1e12) if d.action == "retire"
        )
        assert max(retire_rows.values()) == 1, retire_rows
    finally:
        await store.close()
