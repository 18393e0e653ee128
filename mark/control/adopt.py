"""Adoption after a (re)start: the fleet this cluster's tags say it owns becomes the
controller's, recorded and counted as wanted now; nothing is launched."""

from __future__ import annotations

from dataclasses import replace

from mark.config import Settings
from mark.control.recorder import Recorder
from mark.control.vanished import end_vanished
from mark.ports import Fleet, InstanceInfo, InstanceState, Store
from mark.state.records import Decision
from provisioner.control_state import ControlState


async def adopt_fleet(
    fleet: Fleet,
    store: Store,
    recorder: Recorder,
    settings: Settings,
    state: ControlState,
    now: float,
) -> tuple[list[InstanceInfo], ControlState]:
    """Record every owned instance and count it as wanted now.

    The cool-down starts afresh rather than retiring a fleet the old controller
    had just been using; the next step plans with them and launches only what
    they do not cover. Instances the store still holds as live that the cloud
    no longer lists (or lists shutting down) are marked terminated, and their last run
    billed if the ledger lacks it (``mark.control.vanished``): a daemon killed between
    a terminate call and its billing loses no run.
    """
    # One already shutting down was being retired (EC2 bills it no more): not adopted.
    listed = [i for i in await fleet.list() if i.state is not InstanceState.SHUTTING_DOWN]
    for inst in listed:
        await recorder.set_state(inst, inst.state, now, "adopted after a restart")
    await end_vanished(store, recorder, listed, now, at_restart=True)
    for spec in settings.models:
        mine = [i for i in listed if i.model == spec.name]
        control = state.of(spec.name)
        wanted = {**control.last_wanted, **{i.instance_id: now for i in mine}}
        state = state.with_model(spec.name, replace(control, last_wanted=wanted))
        if mine:
            await store.record_decision(
                Decision(
                    spec.name,
                    now,
                    "adopt",
                    f"{len(mine)} instance(s) found by this cluster's tags at start",
                    count=len(mine),
                )
            )
    return listed, state
