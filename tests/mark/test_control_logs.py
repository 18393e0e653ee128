"""Every act of the control loop on instances is logged with the decision and its reason:
an operator reading "agent for i-... at ..." finds, above it, why that instance exists."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from mark.catalog import load_catalog
from mark.clock import ManualClock
from mark.config import load_settings
from mark.control import Controller
from mark.control.recorder import Recorder
from mark.sim.fleet import SimFleet
from mark.sim.memstore import MemoryStore
from mark.state import open_store
from provisioner.control_state import Note
from provisioner.greedy import PlannerOption

T0 = 1_700_000_000.0


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "mark.control" and r.levelno == level
    ]


async def test_an_slo_monitor_backup_is_logged_with_why_it_was_launched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mark.control")
    settings = load_settings(overrides={"slo_monitor": {"last_m": 10, "launch_l": 2}})
    clock = ManualClock(T0)
    fleet = SimFleet(load_catalog(), clock.now)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        options = [PlannerOption("c5.large", "on-demand", 0.085, 20.0)]
        ctl = Controller(settings, fleet, store, {"digits": options})
        assert await ctl.check_slo(clock.now(), {"digits": [0.01] * 10}) == []
        launched = await ctl.check_slo(clock.now(), {"digits": [0.5] * 5})  # RT_max 100 ms
        assert len(launched) == 2
    finally:
        await store.close()
    (line,) = [m for m in _lines(caplog, logging.INFO) if " backup " in m]
    ids = sorted(i.instance_id for i in await fleet.list())
    assert re.fullmatch(r"digits: backup 2× c5\.large/on-demand \((.+)\): (.+)", line)
    assert sorted(line.split("(")[1].split(")")[0].split(", ")) == ids
    # the SLO monitor's verdict, as `mark plan --explain` records it
    assert line.endswith("only 50.0% of the last 10 requests met RT_max 100 ms (SL_min 98%)")


def test_terminations_starts_and_stops_say_why_and_failures_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="mark.control")
    rec = Recorder(MemoryStore(), load_catalog())
    rec.decisions(
        "digits",
        T0,
        [
            Note("retire", "cool-down over", instance_id="i-0abc"),
            Note("retire-warm", "stopped into the warm pool", "c5.large", "spot", 1, "i-0def"),
            Note("stop-standby", "load back under the fleet", count=2),
            Note("launch", "planned"),  # Reconciler.launch logs it, with its ids
            Note("retire-failed", "the cloud refused: throttled"),
        ],
    )
    assert _lines(caplog, logging.INFO) == [
        "digits: retire i-0abc: cool-down over",
        "digits: retire-warm i-0def (c5.large/spot): stopped into the warm pool",
        "digits: stop-standby 2: load back under the fleet",
    ]
    assert _lines(caplog, logging.WARNING) == [
        "digits: retire-failed: the cloud refused: throttled"
    ]
