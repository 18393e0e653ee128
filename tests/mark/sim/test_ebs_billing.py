"""A stopped instance still pays for its EBS volume: the simulated fleet records each
stopped period and the world bills it per GB-second at the catalog's gp3 price."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources

import numpy as np
import pytest

from bouncer.latency import BatchLatency
from mark.billing import ebs_charge
from mark.catalog import Market, load_catalog
from mark.ports import InstanceRole, LaunchRequest
from mark.sim.fleet import SimFleet, Stopped
from mark.sim.models import SimModel
from mark.sim.policies import POLICIES
from mark.sim.run import SimConfig
from mark.sim.workloads import Workload
from mark.sim.world import SimWorld, VirtualClock

GP3 = 0.08  # $ per GB-month, us-east-1 (the shipped price file)
MONTH_S = 730 * 3600  # the month a GB-month is prorated over


def _expected(gb: float, seconds: float) -> float:
    return seconds * gb * GP3 / MONTH_S


def test_the_catalog_carries_the_shipped_gp3_price() -> None:
    raw = json.loads(
        resources.files("mark.catalog").joinpath("data", "prices-us-east-1.json").read_text()
    )
    assert raw["ebs_gp3_per_gb_month"] == GP3
    assert load_catalog().ebs_gb_month == GP3


def test_ebs_charge_prorates_the_gb_month_by_the_second() -> None:
    assert ebs_charge(8.0, GP3, 100.0, 400.0) == pytest.approx(300 * 8 * 0.08 / 730 / 3600)
    assert ebs_charge(1.0, GP3, 0.0, MONTH_S) == pytest.approx(GP3)  # a GB for a month
    assert ebs_charge(8.0, GP3, 5.0, 5.0) == 0.0
    with pytest.raises(ValueError, match="before it starts"):
        ebs_charge(8.0, GP3, 400.0, 100.0)


async def _fleet_with_one(
    role: InstanceRole = InstanceRole.STANDBY,
) -> tuple[SimFleet, VirtualClock, str]:
    clock = VirtualClock()
    fleet = SimFleet(load_catalog(), clock.now, boot_delay_s=lambda _t: 10.0)
    (inst,) = await fleet.launch(LaunchRequest("m", "t3.large", Market.ON_DEMAND, role=role))
    return fleet, clock, inst.instance_id


async def test_a_stop_then_start_records_exactly_the_stopped_seconds() -> None:
    fleet, clock, iid = await _fleet_with_one()
    clock.t = 100.0
    await fleet.stop([iid])
    clock.t = 400.0
    await fleet.start([iid])
    fleet.close_runs(1000.0)
    assert fleet.stopped == [Stopped(iid, "t3.large", "standby", 100.0, 400.0)]
    assert [(r.start, r.end) for r in fleet.runs] == [(0.0, 100.0), (400.0, 1000.0)]


async def test_a_second_stop_of_a_stopped_instance_keeps_one_period() -> None:
    fleet, clock, iid = await _fleet_with_one()
    clock.t = 100.0
    await fleet.stop([iid])
    clock.t = 200.0
    await fleet.stop([iid, iid])
    clock.t = 400.0
    await fleet.start([iid])
    assert [(p.start, p.end) for p in fleet.stopped] == [(100.0, 400.0)]


async def test_terminating_a_stopped_instance_ends_its_period() -> None:
    fleet, clock, iid = await _fleet_with_one(InstanceRole.SERVING)
    clock.t = 100.0
    await fleet.stop([iid])
    clock.t = 250.0
    await fleet.terminate([iid])
    fleet.close_runs(1000.0)
    assert fleet.stopped == [Stopped(iid, "t3.large", "serving", 100.0, 250.0)]
    assert [(r.start, r.end) for r in fleet.runs] == [(0.0, 100.0)]


async def test_the_end_of_the_simulation_ends_a_period_still_open() -> None:
    fleet, clock, iid = await _fleet_with_one()
    clock.t = 100.0
    await fleet.stop([iid])
    fleet.close_runs(1000.0)
    assert [(p.start, p.end) for p in fleet.stopped] == [(100.0, 1000.0)]


async def test_an_instance_never_stopped_has_no_stopped_period() -> None:
    fleet, clock, iid = await _fleet_with_one(InstanceRole.SERVING)
    clock.t = 500.0
    await fleet.terminate([iid])
    fleet.close_runs(1000.0)
    assert fleet.stopped == []


EPOCH = 1_700_000_000.0
HISTORY_S = 2 * 3600
WINDOW_S = 3600


def _world(volume_gb: float) -> SimWorld:
    model = SimModel(
        name="tiny",
        rt_max_s=0.6,
        sl_min=0.98,
        latency={"c5.large": BatchLatency(((1, 0.2),))},
        lambda_t1_s=0.4,
        standby_t1_s=0.2,
    )
    w = Workload("tiny", np.zeros(HISTORY_S + WINDOW_S), EPOCH, HISTORY_S, WINDOW_S)
    cfg = SimConfig(warmup_s=600, volume_gb=volume_gb)
    return SimWorld(w, model, POLICIES["mark-spot"], cfg, arrivals=np.zeros(0))


async def _bill(volume_gb: float) -> tuple[SimWorld, dict[str, float], float]:
    """A standby stopped from before the window until 400 s into it, a serving instance
    stopped 50 s before the end and never started again, and one never stopped."""
    world = _world(volume_gb)
    fleet, t0, t_end = world.fleet, world.t0, world.t_end
    world.clock.t = world.t_begin
    standby = LaunchRequest("tiny", "t3.large", Market.ON_DEMAND, role=InstanceRole.STANDBY)
    (a,) = await fleet.launch(standby)
    (b,) = await fleet.launch(LaunchRequest("tiny", "c5.large", Market.ON_DEMAND))
    await fleet.launch(LaunchRequest("tiny", "c5.large", Market.SPOT))
    world.clock.t = t0 - 100.0
    await fleet.stop([a.instance_id])
    world.clock.t = t0 + 400.0
    await fleet.start([a.instance_id])
    world.clock.t = t_end - 50.0
    await fleet.stop([b.instance_id])
    fleet.close_runs(t_end)
    r = world.result()
    return world, dict(r.costs), r.total_cost


async def test_the_world_bills_the_stopped_seconds_within_the_window_as_ebs() -> None:
    _, costs, total = await _bill(volume_gb=500.0)
    # Before t0 is warm-up: of the standby's stop only 400 s count; then b's last 50 s.
    expected = _expected(500.0, 400.0 + 50.0)
    assert expected == pytest.approx(500 * 0.08 * 450 / 2_628_000)
    assert costs["ebs"] == pytest.approx(expected)
    assert total == pytest.approx(
        costs["on-demand"] + costs["spot"] + costs["standby"] + costs["lambda"] + expected
    )
    _, free, total_free = await _bill(volume_gb=0.0)
    assert free["ebs"] == 0.0
    assert total - total_free == pytest.approx(expected)
    assert {k: v for k, v in costs.items() if k != "ebs"} == pytest.approx(
        {k: v for k, v in free.items() if k != "ebs"}
    )


async def test_the_ebs_part_is_in_the_result_row() -> None:
    world, costs, _ = await _bill(volume_gb=500.0)
    row = world.result().row()
    assert row["cost_ebs"] == round(costs["ebs"], 4) > 0
    parts = ("cost_on_demand", "cost_spot", "cost_standby", "cost_ebs", "cost_lambda")
    assert row["cost_total"] == pytest.approx(sum(row[k] for k in parts), abs=1e-3)


async def test_a_world_whose_instances_never_stop_bills_no_ebs() -> None:
    world = _world(volume_gb=500.0)
    world.clock.t = world.t_begin
    (a,) = await world.fleet.launch(LaunchRequest("tiny", "c5.large", Market.ON_DEMAND))
    world.clock.t = world.t0 + 600.0
    await world.fleet.terminate([a.instance_id])
    world.fleet.close_runs(world.t_end)
    r = world.result()
    assert r.costs["ebs"] == 0.0
    assert r.costs["on-demand"] > 0


def _simulate_costs(volume_gb: str) -> dict[str, float]:
    args = ["--trace", "surge", "--hours", "0.5", "--base-rps", "10", "--policies", "mark"]
    args += ["--warmup-s", "900"]
    args += ["--predictor", "oracle", "--volume-gb", volume_gb, "--format", "json"]
    done = subprocess.run(
        [sys.executable, "-m", "mark.cli.main", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["results"]
    return {k: v for k, v in row.items() if k.startswith("cost_") and "bound" not in k}


@pytest.mark.slow
def test_simulate_volume_gb_sizes_the_warm_pools_volumes() -> None:
    """mark stops the instances it retires after the surge into the warm pool: with
    ``--volume-gb 0`` they cost nothing stopped, with 100 their volumes are the
    ``cost_ebs`` part, and only it changes. (mark-spot's standbys no longer serve here:
    where spill answers in time, ``provisioner.standby_value`` keeps none.)"""
    none, big = _simulate_costs("0"), _simulate_costs("100")
    assert none["cost_ebs"] == 0.0 < big["cost_ebs"]
    assert big["cost_total"] - none["cost_total"] == pytest.approx(big["cost_ebs"], abs=2e-4)
    others = ("cost_on_demand", "cost_spot", "cost_standby", "cost_lambda")
    assert [big[k] for k in others] == [none[k] for k in others]
