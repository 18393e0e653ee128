"""The Grafana dashboard names only metrics the daemon exposes: it cannot drift."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from mark.catalog import Market, load_catalog
from mark.config import ApiSpec
from mark.control.recorder import Recorder
from mark.ports import InstanceInfo, InstanceRole, InstanceState
from mark.serve.auth import Auth, KeyCache
from mark.serve.telemetry import Telemetry
from mark.state.outbox import Outbox
from provisioner.control_state import Note
from tests.prometheus_text import parse_exposition

DASHBOARD = Path(__file__).resolve().parents[2] / "infra" / "grafana" / "mark-dashboard.json"
_METRIC = re.compile(r"\bmark_[a-z0-9_]+\b")


class _Store:
    """Takes what the recorder writes and forgets it: only its counters are under test."""

    async def upsert_instance(self, *_: Any, **__: Any) -> None:
        return None

    async def add_charges(self, _: Sequence[Any]) -> None:
        return None


async def daemon_exposition() -> str:
    """What the daemon's /metrics joins (telemetry, API refusals, the controller's
    recorder, the store's buffer), each with something to count so every series shows."""
    tel = Telemetry("m", rt_max_ms=100.0)
    tel.arrival(0.0)
    tel.outcome(0.0, 0.05, ok=True, spilled=False)
    tel.spilled("rejected", 1, "c5.large")
    tel.lambda_charged(0.01)
    auth = Auth(KeyCache(), ApiSpec(), lambda _: None)
    auth.refused[(401, "")] += 1
    rec = Recorder(_Store(), load_catalog(), 0.001)  # type: ignore[arg-type]
    inst = InstanceInfo(
        "i-1", "m", "c5.large", Market.ON_DEMAND, InstanceState.PENDING, InstanceRole.SERVING, 0.0
    )
    await rec.set_state(inst, InstanceState.PENDING, 0.0, "planner")
    rec.decisions(
        "m",
        0.0,
        [
            Note("launch", "plan", "c5.large", "on-demand"),
            Note("spend-rail", "over", "c5.large", "on-demand"),
            Note("forecast-clipped", "too high"),
        ],
    )
    other = InstanceInfo(
        "i-2", "m", "c5.large", Market.SPOT, InstanceState.RUNNING, InstanceRole.SERVING, 0.0
    )
    await rec.bill_retired("m", ["i-2"], [other], 120.0)
    for iid in ("i-3", "i-4"):  # stopped into the warm pool; i-4 then ended
        pooled = InstanceInfo(
            iid, "m", "c5.large", Market.ON_DEMAND, InstanceState.RUNNING, InstanceRole.SERVING, 0.0
        )
        await rec.set_state(pooled, InstanceState.STOPPED, 60.0, "retire-warm")
    ended = InstanceInfo(
        "i-4", "m", "c5.large", Market.ON_DEMAND, InstanceState.STOPPED, InstanceRole.SERVING, 0.0
    )
    await rec.set_state(ended, InstanceState.TERMINATED, 3660.0, "warm-expired")
    rec.decisions("m", 120.0, [Note("retire", "cool-down over", instance_id="i-2")])
    outbox = Outbox()
    outbox.dropped["charges"] += 1
    return tel.prometheus() + auth.prometheus() + rec.prometheus() + outbox.prometheus()


def _expressions(panels: Sequence[dict[str, Any]]) -> Iterator[str]:
    for p in panels:
        yield from (t["expr"] for t in p.get("targets", []))
        yield from _expressions(p.get("panels", []))


async def test_every_metric_the_dashboard_names_is_exposed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [*_expressions(dash["panels"])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    named = {m for e in exprs for m in _METRIC.findall(e)}
    exposed = {name for name, _ in parse_exposition(await daemon_exposition())}
    assert named and named <= exposed, f"not exposed: {sorted(named - exposed)}"


async def test_the_dashboard_shows_every_decision_metric() -> None:
    text = DASHBOARD.read_text()
    for name in (
        "mark_launches_total",
        "mark_retirements_total",
        "mark_spills_total",
        "mark_bouncer_rejects_total",
        "mark_requests_within_slo_total",
        "mark_fleet_cost_per_hour_dollars",
        "mark_lambda_cost_dollars_total",
        "mark_fleet_instances",
    ):
        assert name in text


def test_panels_have_unique_ids_and_a_datasource() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dash["panels"] if "targets" in p)
