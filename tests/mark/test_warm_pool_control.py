"""The warm pool carried out by the controller the daemon and the simulator run: retired
instances are drained and stopped, the load's return starts them (no launch), the ledger
bills each run, a restart keeps the pool's clock, and past its hold an instance ends."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from bouncer.latency import BatchLatency
from mark.catalog import Market, load_catalog
from mark.clock import ManualClock
from mark.config import Settings, load_settings
from mark.control import Controller, build_options
from mark.errors import CloudError
from mark.ports import InstanceState
from mark.sim.fleet import SimFleet
from mark.state import ArrivalWindow, open_store
from provisioner.control_state import Member, WarmPoolConfig
from provisioner.greedy import PlannerOption
from provisioner.spill_evidence import SpillCounts
from provisioner.warm_pool import hold_s

T0 = 1_700_000_000.0
BOOT = 90.0


class _Draining:
    def __init__(self) -> None:
        self.retired: list[list[str]] = []
        self.kept: list[list[str]] = []

    async def retire(self, instance_ids: Sequence[str]) -> None:
        self.retired.append(sorted(instance_ids))

    async def keep(self, instance_ids: Sequence[str]) -> None:
        self.kept.append(sorted(instance_ids))


def _world(
    timings: dict[str, object],
) -> tuple[Settings, list[PlannerOption], ManualClock, SimFleet]:
    """One model on c5.large, a 90 s boot, 8 GB volumes: its settings, options, clock, fleet."""
    settings = load_settings(
        overrides={
            "offerings": {"types": ["c5.large"], "markets": ["on-demand"], "volume_gb": 8},
            "timings": timings,
        }
    )
    lat = {"c5.large": BatchLatency.from_mapping({1: 0.020, 8: 0.080})}
    catalog = load_catalog()
    options = build_options(
        settings.models[0], catalog, ["c5.large"], [Market.ON_DEMAND], lat, BOOT
    )
    clock = ManualClock(T0)
    return settings, options, clock, SimFleet(catalog, clock.now, boot_delay_s=lambda _t: BOOT)


async def test_retired_instances_wait_stopped_and_start_when_the_load_returns(
    tmp_path: Path,
) -> None:
    settings, options, clock, fleet = _world({"warm_start_s": 20})
    spec = settings.models[0]
    catalog = load_catalog()
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    rate = 3 * options[0].capacity_rps

    async def load(at: float, r: float, minutes: int = 60) -> None:
        n = minutes * 12
        await store.add_arrivals(
            [ArrivalWindow(spec.name, at - 5 * n + 5 * k, 5.0, int(r * 5)) for k in range(n)]
        )

    try:
        await load(T0, rate)
        ctl = Controller(
            settings, fleet, store, {spec.name: options}, boot_s=BOOT, cluster="c", holder="a"
        )
        await ctl.adopt(clock.now())
        drained = _Draining()
        ctl.draining = drained
        (first,) = await ctl.step(clock.now())
        bought = sorted(i.instance_id for i in first.launched)
        assert len(bought) >= 2

        # The load stops: past the billing minimum and a start's cool-down they are drained
        # and stopped, not terminated.
        clock.advance(3600)
        (idle,) = await ctl.step(clock.now())
        assert idle.retired == [] and sorted(idle.stopped) == bought
        assert drained.retired == [bought]
        states = {i.instance_id: i.state for i in await fleet.list()}
        assert {states[i] for i in bought} == {InstanceState.STOPPED}
        ledger = await store.ledger(model=spec.name)
        assert sorted(str(e.instance_id) for e in ledger) == bought  # each run billed at its stop
        assert all(e.end == T0 + 3600 for e in ledger)

        # A restart keeps when each was stopped (the hold runs on).
        await ctl.resign()
        ctl2 = Controller(
            settings, fleet, store, {spec.name: options}, boot_s=BOOT, cluster="c", holder="b"
        )
        await ctl2.adopt(clock.now())
        assert ctl2.state.warm.stopped_at == dict.fromkeys(bought, T0 + 3600)
        ctl2.draining = drained

        # The load returns: the stopped ones start, nothing is launched, and the request
        # path may send to them again.
        clock.advance(600)
        await load(clock.now(), rate, minutes=10)
        (back,) = await ctl2.step(clock.now())
        assert back.launched == [] and sorted(back.started) == bought
        assert drained.kept == [bought]
        states = {i.instance_id: i.state for i in await fleet.list()}
        assert {states[i] for i in bought} == {InstanceState.PENDING}
        plan = (await store.plans(spec.name))[0]
        assert "warm-start" in [d.action for d in plan.decisions]

        # Stopped again, then held past the break-even of their volume: terminated.
        clock.advance(3600)
        (again,) = await ctl2.step(clock.now())
        assert sorted(again.stopped) == bought
        warm = WarmPoolConfig(20.0, 8 * catalog.ebs_gb_month * 3600 / (730 * 3600))
        price = catalog.offering("c5.large", Market.ON_DEMAND).price_per_hour
        stopped = Member("i", spec.name, "c5.large", "on-demand", "serving", "stopped", 0.0, price)
        held = hold_s(stopped, BOOT, warm)
        assert held == pytest.approx(3600 * (0.085 * 70 / 3600) / (8 * 0.08 / 730))
        clock.advance(held + 1)
        (ended,) = await ctl2.step(clock.now())
        assert sorted(ended.retired) == bought
        assert {i.instance_id for i in await fleet.list()} == set()
        ledger = await store.ledger(model=spec.name)
        assert len(ledger) == 2 * len(bought)  # two runs each, nothing billed while stopped
    finally:
        await store.close()


class _RefusingStarts(SimFleet):
    """EC2 refusing to start stopped instances (``InsufficientInstanceCapacity`` on
    ``StartInstances`` is a documented failure)."""

    async def start(self, instance_ids: Sequence[str]) -> None:
        raise CloudError(f"InsufficientInstanceCapacity starting {list(instance_ids)}")


async def test_a_refused_warm_start_launches_what_the_plan_wanted_instead(
    tmp_path: Path,
) -> None:
    settings, options, clock, _ = _world({"warm_start_s": 20})
    fleet = _RefusingStarts(load_catalog(), clock.now, boot_delay_s=lambda _t: BOOT)
    spec = settings.models[0]
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    rate = 3 * options[0].capacity_rps

    async def load(at: float, minutes: int) -> None:
        n = minutes * 12
        await store.add_arrivals(
            [ArrivalWindow(spec.name, at - 5 * n + 5 * k, 5.0, int(rate * 5)) for k in range(n)]
        )

    try:
        await load(T0, 60)
        ctl = Controller(settings, fleet, store, {spec.name: options}, boot_s=BOOT)
        (first,) = await ctl.step(clock.now())
        bought = sorted(i.instance_id for i in first.launched)
        clock.advance(3600)
        (idle,) = await ctl.step(clock.now())
        assert sorted(idle.stopped) == bought
        clock.advance(600)
        await load(clock.now(), 10)
        (back,) = await ctl.step(clock.now())
        # the start was refused: as many of the plan's type launched, none counted started
        assert back.started == []
        assert sorted(i.instance_type for i in back.launched) == ["c5.large"] * len(bought)
        live = {i.instance_id: i.state for i in await fleet.list()}
        assert {live[i] for i in bought} == {InstanceState.STOPPED}
        decisions = [d.action for d in (await store.plans(spec.name))[0].decisions]
        assert "warm-start-failed" in decisions and "launch" in decisions
    finally:
        await store.close()


@pytest.mark.parametrize("warm_start_s", [None, 90.0], ids=["off", "no-faster-than-a-boot"])
async def test_without_a_faster_start_retired_instances_are_terminated(
    tmp_path: Path, warm_start_s: float | None
) -> None:
    assert load_settings().timings.warm_start_s == 20.0  # on by default
    settings, options, clock, fleet = _world({"warm_start_s": warm_start_s})
    spec = settings.models[0]
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        rate = 3 * options[0].capacity_rps
        await store.add_arrivals(
            [ArrivalWindow(spec.name, T0 - 3600 + 5 * k, 5.0, int(rate * 5)) for k in range(720)]
        )
        ctl = Controller(settings, fleet, store, {spec.name: options}, boot_s=BOOT)
        (first,) = await ctl.step(clock.now())
        clock.advance(3600)
        (idle,) = await ctl.step(clock.now())
        assert idle.stopped == [] and sorted(idle.retired) == sorted(
            i.instance_id for i in first.launched
        )
        assert await fleet.list() == []
    finally:
        await store.close()


async def test_the_hold_counts_spill_once_spill_is_measured_to_answer_in_time(
    tmp_path: Path,
) -> None:
    """The controller's warm pool learns what a start spares against spill from the spill
    it measured: nothing until spill is known to answer in time, then each offering's
    capacity at spill's measured price, and the hold grows by that much for the share of
    starts that met a load outrunning the fleet."""
    settings, options, _clock, fleet = _world({"warm_start_s": 20})
    spec = settings.models[0]
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        ctl = Controller(settings, fleet, store, {spec.name: options}, boot_s=BOOT)
        warm = ctl.config_for(spec).warm
        assert warm is not None and warm.spill_per_hour == {}
        stopped = Member(
            "i",
            spec.name,
            "c5.large",
            "on-demand",
            "serving",
            "stopped",
            0.0,
            options[0].price_per_hour,
        )
        alone = hold_s(stopped, BOOT, warm)
        await ctl.record_spills({spec.name: SpillCounts(100, 20, 100 * 2e-5)})  # late
        late = ctl.config_for(spec).warm
        assert late is not None and late.spill_per_hour == {}
        await ctl.record_spills({spec.name: SpillCounts(1000, 1000, 1000 * 2e-5)})
        in_time = ctl.config_for(spec).warm
        assert in_time is not None
        price = ctl.state.of(spec.name).spill.cost_per_request()
        assert price is not None and price == pytest.approx(2e-5, rel=0.05)
        per_hour = options[0].capacity_rps * 3600 * price
        assert in_time.spill_per_hour == {options[0].key: pytest.approx(per_hour)}
        assert hold_s(stopped, BOOT, in_time) == pytest.approx(alone)  # no start met spill
        grown = hold_s(stopped, BOOT, in_time, outrun_share=1.0)
        assert grown == pytest.approx(alone * (1 + per_hour / options[0].price_per_hour))
    finally:
        await store.close()
