"""This frontend among the cluster's: its beat (its row in the store, every
``frontend_store.BEAT_S``), the live frontends it reads back (what per-key limits are
shared by, what ``mark status`` lists), and, while it leads, the other frontends'
counts handed to the controller beside its own (``mark.control.cluster_feed``)."""

from __future__ import annotations

import logging

from sqlalchemy.exc import SQLAlchemyError

from bouncer.miss_budget import NO_TALLY, MissTally
from mark.errors import StoreError
from mark.identity import frontend_id
from mark.running import Running
from mark.serve.auth import AUTH
from mark.state import FrontendRecord
from mark.state.frontend_store import LIVE_S
from provisioner.spill_evidence import SpillCounts

log = logging.getLogger("mark.daemon")


def tallies(run: Running, now: float) -> dict[str, MissTally]:
    """Per model, this frontend's miss budget's arrivals and misses now."""
    return {
        name: served.dispatcher.budget.count(now)
        for name, served in run.models.items()
        if served.dispatcher is not None and served.dispatcher.budget is not None
    }


async def beat(run: Running, now: float) -> None:
    """Write this frontend's row and read back the live ones; a store that does not
    answer skips a beat (the next one replaces it)."""
    mine = tallies(run, now)
    rec = FrontendRecord(
        frontend_id(),
        run.url,
        run.started_at,
        now,
        run.synced_at,
        {
            name: served.telemetry.feed(mine.get(name, NO_TALLY))
            for name, served in run.models.items()
            if served.telemetry is not None
        },
    )
    try:
        await run.store.beat(rec)
        run.cluster = await run.store.frontends(now - LIVE_S)
    except (StoreError, SQLAlchemyError, OSError) as exc:
        log.warning("cannot beat as a frontend: %s", exc)
        return
    auth = run.runner.app.get(AUTH)
    if auth is not None:
        auth.limiter.share = max(1, len(run.cluster))


def with_others(
    run: Running,
    latencies: dict[str, list[float]],
    spills: dict[str, SpillCounts],
    misses: dict[str, MissTally],
    leading: bool,
) -> None:
    """While this frontend leads: the other frontends' outcomes, spills and miss tallies
    since the last look added to its own, in place. Otherwise the look starts afresh."""
    if not leading:
        run.feed.reset()
        return
    for model, seen in run.feed.look(run.cluster).items():
        latencies.setdefault(model, []).extend(seen.latencies)
        s = spills.get(model, SpillCounts())
        o = seen.spills
        spills[model] = SpillCounts(s.total + o.total, s.within + o.within, s.cost + o.cost)
        misses[model] = misses.get(model, NO_TALLY).merged(seen.tally)
