"""The orphan sweep's shell when the cloud refuses the termination: still reported, the
clock kept, tried again at the next step."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from pathlib import Path

from mark.catalog import Market
from mark.config import load_settings
from mark.control import Controller
from mark.errors import NotOwned
from mark.ports import InstanceInfo, InstanceRole, InstanceState, LaunchRequest
from mark.state import open_store

T0 = 1_700_000_000.0


class StubbornFleet:
    """Lists one tagged instance of a removed model; refuses to terminate it once."""

    def __init__(self) -> None:
        self.refusals = 1
        self.terminated: list[str] = []
        self.instance = InstanceInfo(
            "i-old",
            "retired",
            "c5.large",
            Market.ON_DEMAND,
            InstanceState.RUNNING,
            InstanceRole.SERVING,
            T0 - 3600,
            tags={"mark:cluster": "c"},
        )

    async def list(self) -> builtins.list[InstanceInfo]:
        return [] if self.terminated else [self.instance]

    async def launch(self, request: LaunchRequest) -> builtins.list[InstanceInfo]:
        raise AssertionError("nothing is to be launched")

    async def terminate(self, instance_ids: Sequence[str]) -> None:
        if self.refusals:
            self.refusals -= 1
            raise NotOwned("the cloud says no")
        self.terminated += instance_ids


async def test_a_refused_orphan_termination_is_reported_and_tried_again(tmp_path: Path) -> None:
    # No exploration: the configured model has no rated type, which would explore one.
    settings = load_settings(
        overrides={
            "control": {"orphan_grace_s": 0},
            "planner": {"explore_unprofiled": {"max_concurrent": 0}},
        }
    )
    fleet = StubbornFleet()
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path}/s.db", upgrade=True)
    try:
        ctl = Controller(settings, fleet, store, {}, cluster="c")  # type: ignore[arg-type]
        await ctl.step(T0)
        (d,) = [d for d in await store.decisions(T0, T0 + 1) if d.instance_id == "i-old"]
        assert d.action == "orphan" and "terminating it failed" in d.reason
        assert ctl.state.orphans == {"i-old": T0}
        await ctl.step(T0 + 60)
        assert fleet.terminated == ["i-old"] and ctl.state.orphans == {}
        (d,) = [d for d in await store.decisions(T0 + 60, T0 + 61) if d.instance_id == "i-old"]
        assert d.action == "retire-orphan" and d.model == "retired"
        (charge,) = await store.ledger(model="retired")
        assert charge.instance_id == "i-old" and charge.end == T0 + 60
    finally:
        await store.close()
