"""The stopped standby pool priced: no more standbys than the spill they save pays for."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from provisioner.control_state import ControlState, Member, ModelControl, Snapshot, StepConfig
from provisioner.greedy import PlannerOption
from provisioner.orphan_step import BEYOND_POOL, OrphanConfig, StandbyPool, orphan_step
from provisioner.spill_evidence import SpillEvidence
from provisioner.spot import SpotHolding, standby_pool_size
from provisioner.standby_step import standby_pool_step
from provisioner.standby_value import (
    StandbyValue,
    interruptions_per_hour,
    standbys_wanted,
    standbys_worth,
)

SPOT = PlannerOption("c5.large", "spot", 0.03, 10.0, latency_s=0.01)
FLEET = [SpotHolding(SPOT.key, 10, 10.0)]  # 100 r/s of spot capacity in one pool
VALUE = StandbyValue(interruptions_per_hour=0.01, gap_s=120.0, volume_per_hour=0.001)


def spill(price: float, within: int = 100, total: int = 100) -> SpillEvidence:
    return SpillEvidence().observe(within, total, price * total)


def test_the_pool_is_worth_what_the_spill_it_saves_pays_for_its_volumes() -> None:
    # 0.01 interruptions/h × 100 r/s × 120 s × $1e-4 = $0.012/h saved at most; at $0.001/h a
    # volume, 12 standbys are paid for.
    assert standbys_worth(FLEET, VALUE, spill(1e-4)) == 12
    # half the interruption rate, half the pool
    half = replace(VALUE, interruptions_per_hour=0.005)
    assert standbys_worth(FLEET, half, spill(1e-4)) == 6
    # dearer volumes, fewer standbys
    assert standbys_worth(FLEET, replace(VALUE, volume_per_hour=0.004), spill(1e-4)) == 3


@pytest.mark.parametrize(
    ("evidence", "value"),
    [
        (SpillEvidence(), VALUE),  # spill not measured yet: the lost load could miss
        (spill(1e-4, within=10), VALUE),  # spill late: the lost load would miss
        (spill(1e-4), None),  # nothing prices a standby
        (spill(1e-4), replace(VALUE, volume_per_hour=0.0)),  # free volumes
    ],
)
def test_where_spill_cannot_stand_in_the_pool_is_not_capped(
    evidence: SpillEvidence, value: StandbyValue | None
) -> None:
    assert standbys_worth(FLEET, value, evidence) == math.inf
    assert standbys_wanted(FLEET, 10.0, 0.25, value, evidence) == standby_pool_size(FLEET, 10.0)


def test_the_pool_kept_is_the_paper_s_but_never_beyond_its_worth() -> None:
    assert standby_pool_size(FLEET, 5.0) == 20  # all 100 r/s in one pool are at risk
    assert standbys_wanted(FLEET, 5.0, 0.25, VALUE, spill(1e-4)) == 12
    assert standbys_wanted(FLEET, 10.0, 0.25, VALUE, spill(1e-4)) == 10  # the paper's is less
    assert standbys_wanted(FLEET, 5.0, 0.25, VALUE, spill(1e-6)) == 0  # cheap spill: none
    assert standbys_wanted([], 5.0, 0.25, VALUE, spill(1e-4)) == 0


def test_a_monthly_share_is_a_rate_per_instance_hour() -> None:
    assert interruptions_per_hour(0.73) == pytest.approx(0.001)
    assert interruptions_per_hour(-1.0) == 0.0


def member(iid: str, role: str = "serving", state: str = "ready", at: float = 0.0) -> Member:
    if role == "standby":
        return Member(iid, "m", "t3.large", "on-demand", role, state, at, 0.0832)
    return Member(iid, "m", SPOT.instance_type, SPOT.market, role, state, at, SPOT.price_per_hour)


CFG = StepConfig(
    step_s=60.0,
    tau_steps=1,
    boot_s=120.0,
    standby_type="t3.large",
    standby_price=0.0832,
    standby_capacity_rps=5.0,
    standby_value=VALUE,
)


def test_the_pool_step_launches_to_the_worth_and_ends_stopped_standbys_beyond_it() -> None:
    spot = tuple(member(f"s{i}") for i in range(10))
    snap = Snapshot("m", 1000.0, (50.0,) * 5, 50.0, (SPOT,), spot)
    measured = ControlState({"m": ModelControl(spill=spill(1e-4))})
    step = standby_pool_step(snap, measured, CFG, spot, 50.0)
    assert step.launch is not None and step.launch.count == 12  # not the paper's 20
    assert step.end is None
    # spill turns cheap: the stopped standbys are worth less than their volumes and go,
    # newest first; a started one carries load and stays (the stop decides it)
    standbys = (
        member("old", "standby", "stopped", at=10.0),
        member("new", "standby", "stopped", at=20.0),
        member("busy", "standby", "running", at=5.0),
    )
    cheap = ControlState({"m": ModelControl(spill=spill(1e-7))})
    step = standby_pool_step(replace(snap, fleet=(*spot, *standbys)), cheap, CFG, spot, 50.0)
    assert step.launch is None
    assert step.end is not None and step.end.kind == "terminate"
    assert step.end.instance_ids == ("new", "old")
    # with a worth of one, only the newest stopped one goes
    one = ControlState({"m": ModelControl(spill=spill(1e-4 * 3 / 12))})  # worth 3
    step = standby_pool_step(replace(snap, fleet=(*spot, *standbys)), one, CFG, spot, 50.0)
    assert step.end is None  # three standbys, worth three
    unknown = ControlState()
    step = standby_pool_step(replace(snap, fleet=(*spot, *standbys)), unknown, CFG, spot, 50.0)
    assert step.end is None and step.launch is not None and step.launch.count == 17


def test_the_orphan_sweep_sizes_the_pool_as_the_pool_step_does() -> None:
    spot = tuple(replace(member(f"s{i}"), owner="c") for i in range(10))
    stopped = tuple(
        replace(member(f"t{i}", "standby", "stopped", at=float(i)), owner="c") for i in range(15)
    )
    cfg = OrphanConfig("c", {"m": StandbyPool((SPOT,), 5.0, 0.25, VALUE)}, terminate=())
    measured = ControlState({"m": ModelControl(spill=spill(1e-4))})
    res = orphan_step((*spot, *stopped), 1000.0, measured, cfg)
    beyond = sorted(o.member.instance_id for o in res.orphans if o.kind == BEYOND_POOL)
    assert beyond == ["t12", "t13", "t14"]  # worth 12: the 3 newest beyond it
    unknown = orphan_step((*spot, *stopped), 1000.0, ControlState(), cfg)
    assert [o for o in unknown.orphans if o.kind == BEYOND_POOL] == []  # the paper's 20
