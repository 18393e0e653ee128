"""The ledger bills a standby per run, as EC2 does: launched, stopped, started, stopped
again, retired while stopped. A real SQLite store; ``mark report`` reads the same rows."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from mark.billing import ec2_charge
from mark.catalog import Market, load_catalog
from mark.control.recorder import Recorder
from mark.ports import InstanceInfo, InstanceRole, InstanceState
from mark.report.aggregate import collect_charges
from mark.state.store import open_store

T0 = 1_700_000_000.0
PRICE = load_catalog().offering("t3.large", Market.ON_DEMAND).price_per_hour


def _standby(state: InstanceState, launched_at: float) -> InstanceInfo:
    return InstanceInfo(
        "i-standby",
        "digits",
        "t3.large",
        Market.ON_DEMAND,
        state,
        InstanceRole.STANDBY,
        launched_at,
    )


@pytest.mark.parametrize("moves_launch_time", [True, False], ids=["ec2", "launch-time-kept"])
async def test_a_standby_is_billed_for_each_run_and_not_while_stopped(
    tmp_path: Path, moves_launch_time: bool
) -> None:
    """EC2 reports a start as the instance's launch time; moto keeps the first launch,
    and then the recorder's own record of the start stands for it."""
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/mark.db", upgrade=True)
    try:
        rec = Recorder(store, load_catalog())
        first = _standby(InstanceState.PENDING, T0)
        await rec.launched([first], T0, "standby pool")
        await rec.bill_stopped(
            "digits", [replace(first, state=InstanceState.READY)], T0 + 300, "idle"
        )
        # Started at a notice.
        second = _standby(InstanceState.STOPPED, T0)
        await rec.set_state(second, InstanceState.PENDING, T0 + 1000, "standby started")
        listed_at = T0 + 1000 if moves_launch_time else T0
        started = _standby(InstanceState.READY, listed_at)
        await rec.bill_stopped("digits", [started], T0 + 1030, "idle")
        # Retired while stopped: nothing more ran.
        await rec.bill_retired(
            "digits", ["i-standby"], [_standby(InstanceState.STOPPED, listed_at)], T0 + 5000
        )
        await rec.bill_retired(
            "digits", ["i-standby"], [_standby(InstanceState.STOPPED, listed_at)], T0 + 6000
        )

        ledger = await store.ledger()
        assert [(e.start, e.end, e.billed_seconds) for e in ledger] == [
            (T0, T0 + 300, 300.0),
            (T0 + 1000, T0 + 1030, 60.0),  # EC2's 60 s minimum per run
        ]
        want = ec2_charge(PRICE, T0, T0 + 300).cost + ec2_charge(PRICE, T0 + 1000, T0 + 1030).cost
        assert abs(sum(e.cost for e in ledger) - want) < 1e-12
        assert abs(rec.ec2_cost["digits", "on-demand"] - want) < 1e-12

        # mark report prices the same runs: the ledger's, none added from the events.
        (inst,) = await store.instances()
        assert inst.state == InstanceState.TERMINATED.value
        events = {inst.instance_id: await store.instance_events(inst.instance_id)}
        charges = collect_charges(ledger, [inst], events, since=None, until=T0 + 7000)
        assert abs(sum(c.entry.cost for c in charges) - want) < 1e-12
        assert {c.entry.component for c in charges} == {"standby"}
    finally:
        await store.close()


async def test_a_retired_running_instance_is_billed_from_its_last_start(tmp_path: Path) -> None:
    """A standby retired while running (the retirement repeated): its run, once. A fresh
    recorder (a restarted daemon) bills nothing for one retired while stopped."""
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/mark.db", upgrade=True)
    try:
        rec = Recorder(store, load_catalog())
        running = _standby(InstanceState.READY, T0 + 2000)
        await rec.bill_retired("digits", ["i-standby"], [running], T0 + 2600)
        await rec.bill_retired("digits", ["i-standby"], [running], T0 + 2700)
        assert [(e.start, e.end) for e in await store.ledger()] == [(T0 + 2000, T0 + 2600)]

        fresh = Recorder(store, load_catalog())
        other = replace(_standby(InstanceState.STOPPED, T0), instance_id="i-other")
        await fresh.bill_retired("digits", ["i-other"], [other], T0 + 3000)
        assert len(await store.ledger()) == 1
        assert fresh.ec2_cost == {}
    finally:
        await store.close()


async def test_a_vanished_standby_is_billed_from_its_last_start_once(tmp_path: Path) -> None:
    """A standby stopped (that run billed), started at a notice, then gone from the cloud
    while no daemon billed it: a restarted daemon's fresh recorder bills the second run
    from its start to the old daemon's last step, once; a stopped one, nothing."""
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/mark.db", upgrade=True)
    try:
        old = Recorder(store, load_catalog())
        first = _standby(InstanceState.PENDING, T0)
        await old.launched([first], T0, "standby pool")
        await old.bill_stopped(
            "digits", [replace(first, state=InstanceState.READY)], T0 + 300, "idle"
        )
        await old.set_state(
            _standby(InstanceState.STOPPED, T0), InstanceState.PENDING, T0 + 1000, "notice"
        )
        other = replace(_standby(InstanceState.PENDING, T0), instance_id="i-other")
        await old.launched([other], T0, "standby pool")
        await old.bill_stopped(
            "digits", [replace(other, state=InstanceState.READY)], T0 + 200, "idle"
        )

        fresh = Recorder(store, load_catalog())
        recs = {r.instance_id: r for r in await store.instances()}
        entry = await fresh.bill_vanished(recs["i-standby"], T0 + 1500)
        assert entry is not None and (entry.start, entry.end) == (T0 + 1000, T0 + 1500)
        assert await fresh.bill_vanished(recs["i-other"], T0 + 1500) is None  # stopped
        again = Recorder(store, load_catalog())  # a second restart bills it no more
        assert await again.bill_vanished(recs["i-standby"], T0 + 1800) is None
        ledger = await store.ledger()
        assert sorted((e.instance_id, e.start, e.end) for e in ledger) == [
            ("i-other", T0, T0 + 200),
            ("i-standby", T0, T0 + 300),
            ("i-standby", T0 + 1000, T0 + 1500),
        ]
        assert abs(entry.cost - PRICE * 500 / 3600) < 1e-12
    finally:
        await store.close()


async def test_a_warning_held_for_hours_is_logged_once_per_repeat_but_counted_each_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A model at its fleet bound every step: the decision is recorded and counted each
    step, the warning logged once per ``WARN_REPEAT_S`` whatever count it names, and one
    of another offering at once."""
    from mark.control.recorder import WARN_REPEAT_S
    from provisioner.control_state import Note

    assert WARN_REPEAT_S == 600.0  # the times below are minutes against it
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        rec = Recorder(store, load_catalog())
        held = Note("fleet-bound", "3 × c5.large not launched", "c5.large", "on-demand", 3)
        more = Note("fleet-bound", "5 × c5.large not launched", "c5.large", "on-demand", 5)
        other = Note("fleet-bound", "4 × c5.xlarge not launched", "c5.xlarge", "on-demand", 4)
        with caplog.at_level("WARNING", logger="mark.control"):
            steps = [rec.decisions("m", 60.0 * k, [held]) for k in range(11)]  # 0 to 600 s
            rec.decisions("m", 610.0, [other])  # another offering: at once
            rec.decisions("m", 660.0, [held])  # logged at 600 s: not again yet
            rec.decisions("m", 720.0, [more])  # the same offering, another count: not yet
        assert all(len(d) == 1 and d[0].action == "fleet-bound" for d in steps)
        assert rec.counts[("m", "fleet-bound")] == 14
        warned = [
            r.getMessage()
            for r in caplog.records  # the store's migrations log too, at INFO
            if r.name == "mark.control" and r.levelno >= logging.WARNING
        ]
        assert warned == [
            "m: 3 × c5.large not launched",  # 0 s
            "m: 3 × c5.large not launched",  # 600 s
            "m: 4 × c5.xlarge not launched",  # 610 s
        ]
    finally:
        await store.close()
