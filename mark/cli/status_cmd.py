"""`mark status` and `mark plan`: what the daemon has, and why, read from the state store."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

import typer
from rich.table import Table

from mark.cli.context import console, fail, run_async, state
from mark.cli.profile_cmd import awaiting_profile, awaiting_text
from mark.config import Settings
from mark.ports import Store
from mark.state import Decision, FrontendRecord, LatencyRollup, LeaseRecord, open_store
from mark.state.frontend_store import LIVE_S

FRONTEND_SHOWN_S = 3600.0
"""Frontends that beat within the last hour are listed, the gone ones marked so."""
ORPHAN_ACTIONS = frozenset({"orphan", "retire-orphan"})
"""The orphan sweep's decisions (``provisioner.orphan_step``), recorded outside any plan."""


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


async def orphans_at(store: Store, at: float) -> list[Decision]:
    """The orphan sweep's decisions of the control step taken at ``at`` (every model's)."""
    taken = await store.decisions(at, math.nextafter(at, math.inf))
    return [d for d in taken if d.action in ORPHAN_ACTIONS]


async def last_orphans(store: Store, settings: Settings) -> list[Decision]:
    """The orphans the last control step found: its time is the newest plan's."""
    newest = [p.at for m in settings.models for p in await store.plans(m.name, limit=1)]
    return await orphans_at(store, max(newest)) if newest else []


def _requests(rs: list[LatencyRollup]) -> str:
    """Inference requests (HTTP calls) in ``rs``; a minute recorded before they were
    counted apart from rows makes the sum a lower bound (``≥``), none counted ``-``."""
    known = [r.http_requests for r in rs if r.http_requests is not None]
    if not known:
        return "-" if rs else "0"
    return ("" if len(known) == len(rs) else "≥") + str(sum(known))


def latency_table(
    settings: Settings, rollups: dict[str, list[LatencyRollup]], minutes: int
) -> Table:
    """Each model's recent traffic: requests (HTTP calls) and rows (the instances they
    carried, the unit of load and of the SLO) apart, latency, SLO attainment, spills."""
    lat = Table(title=f"last {minutes} minutes")
    cols = ("model", "requests", "rows", "p50 ms", "p99 ms", "within RT_max", "SL_min", "spilled")
    for col in cols:
        lat.add_column(col, justify="right")
    for m in settings.models:
        rs = rollups.get(m.name, [])
        n = sum(r.requests for r in rs)
        hits = sum(r.slo_hits for r in rs)
        lat.add_row(
            m.name,
            _requests(rs),
            str(n),
            f"{max((r.p50_ms for r in rs), default=0):.1f}",
            f"{max((r.p99_ms for r in rs), default=0):.1f}",
            f"{hits / n:.2%}" if n else "-",
            f"{m.slo.sl_min:.0%}",
            str(sum(r.spilled for r in rs)),
        )
    return lat


def status(
    ctx: typer.Context,
    minutes: int = typer.Option(10, min=1, help="how many recent minutes of latency to show"),
    all_states: bool = typer.Option(False, "--all", help="include terminated instances"),
) -> None:
    """Show the fleet (instance, type, market, role, state) and recent traffic (requests and
    rows), latency and SLO figures."""
    settings = state(ctx).settings()

    async def go() -> None:
        store = await open_store(settings.db_url)
        try:
            live = (
                None
                if all_states
                else ["pending", "running", "ready", "draining", "retiring", "stopping", "stopped"]
            )
            fleet = await store.instances(states=live)
            measured = {
                (p.model, p.instance_type)
                for m in settings.models
                for p in await store.profiles(m.name)
                if p.source == "measured"
            }
            now = time.time()
            rollups = {
                m.name: await store.latency_rollups(m.name, now - 60 * minutes, now)
                for m in settings.models
            }
            orphans = await last_orphans(store, settings)
            awaiting = {m.name: await awaiting_profile(store, m.name) for m in settings.models}
            frontends = await store.frontends(now - FRONTEND_SHOWN_S)
            leases = await store.leases()
        finally:
            await store.close()
        table = Table(title=f"fleet ({len(fleet)} instances)")
        for col in ("instance", "model", "type", "market", "role", "state", "since", "$/h"):
            table.add_column(col)
        table.add_column("profile")
        for i in fleet:
            if (i.model, i.instance_type) in measured:
                rated = "measured"
            elif settings.world == "local":
                rated = "emulated"
            else:
                spec = next((m for m in settings.models if m.name == i.model), None)
                rated = "shipped" if spec is not None and spec.profile else "-"
            table.add_row(
                i.instance_id,
                i.model,
                i.instance_type,
                i.market,
                i.role,
                i.state,
                _when(i.updated_at),
                f"{i.price_per_hour:.4f}",
                rated,
            )
        console.print(table)
        for name, waits in awaiting.items():  # types no profile rates yet, by the last plan
            if waits:
                console.print(f"{name}: {awaiting_text(waits)}", highlight=False)
        if orphans:
            out = Table(title=f"orphans at the last step ({len(orphans)}): claimed by nothing")
            for col in ("instance", "model", "type", "decision", "why"):
                out.add_column(col)
            for d in orphans:
                out.add_row(
                    d.instance_id or "-", d.model, d.instance_type or "-", d.action, d.reason
                )
            console.print(out)
        console.print(latency_table(settings, rollups, minutes))
        console.print(frontend_table(frontends, leases, now))

    run_async(go())


def frontend_table(frontends: list[FrontendRecord], leases: list[LeaseRecord], now: float) -> Table:
    """The frontends seen lately: id, address, up since, last beat, and which leads (holds
    an unexpired lease); one that has not beaten for ``LIVE_S`` is marked gone."""
    leading = {lease.holder for lease in leases if lease.expires_at > now}
    table = Table(title=f"frontends ({sum(now - f.last_seen <= LIVE_S for f in frontends)} live)")
    for col in ("frontend", "address", "up since", "last seen", "leads"):
        table.add_column(col)
    for f in frontends:
        age = now - f.last_seen
        table.add_row(
            f.id,
            f.url,
            _when(f.started_at),
            f"{age:.0f} s ago" + ("" if age <= LIVE_S else " (gone)"),
            "yes" if f.id in leading else "",
        )
    if not frontends:
        table.caption = "none has beaten lately: is the daemon running on this database?"
    return table


def plan(
    ctx: typer.Context,
    model: str | None = typer.Option(None, help="model name (default: the first configured)"),
    explain: bool = typer.Option(False, "--explain", help="why each instance is kept or bought"),
    last: int = typer.Option(1, min=1, max=100, help="how many recent plans"),
) -> None:
    """Show the latest plans: forecast, cost, decisions (and the reasons with --explain)."""
    settings = state(ctx).settings()
    name = model or settings.models[0].name
    settings.model(name)  # unknown model → one-line error

    async def go() -> None:
        store = await open_store(settings.db_url)
        try:
            plans = await store.plans(name, limit=last)
            orphans = {p.at: await orphans_at(store, p.at) for p in plans}
        finally:
            await store.close()
        if not plans:
            fail(f"no plan recorded for {name!r} yet: is the daemon running?", code=1)
        for p in plans:
            peak = max(p.forecast, default=0.0)
            console.print(
                f"[bold]{_when(p.at)}[/] {p.planner}: forecast peak {peak:.1f} r/s over "
                f"{len(p.forecast)} steps, fleet ${p.horizon_cost:.4f}/h",
                highlight=False,
            )
            for d in p.decisions:
                if d.instance_type:
                    what = f": {d.count}× {d.instance_type}" + (f"/{d.market}" if d.market else "")
                else:
                    what = f": {d.instance_id}" if d.instance_id else ""
                console.print(
                    f"  {d.action}{what}" + (f" — {d.reason}" if explain else ""), highlight=False
                )
            for d in orphans[p.at]:  # the cluster's, whichever model they were
                console.print(
                    f"  {d.action}: {d.instance_id} ({d.model or 'no model'})"
                    + (f" — {d.reason}" if explain else ""),
                    highlight=False,
                )
            if explain:
                for line in p.explanation.get("lines", []):
                    console.print(f"  · {line}", highlight=False)
                for iid, why in p.explanation.get("held", []):
                    console.print(f"  · held {iid}: {why}", highlight=False)
                for label, capacity, source in p.explanation.get("offerings", []):
                    console.print(
                        f"  · offering {label}: {capacity:.1f} r/s within the SLO alone, "
                        f"profile {source}",
                        highlight=False,
                    )
                if "rated" in p.explanation:
                    console.print(f"  · each instance rated {p.explanation['rated']}")
                if p.explanation.get("awaiting_profile"):
                    text = awaiting_text(p.explanation["awaiting_profile"])
                    console.print(f"  · {text}", highlight=False)

    run_async(go())
