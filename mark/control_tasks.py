"""The daemon's control side: the controller built from the store's profiles, started once
the store answers (adopting what the cluster owns), and the tasks it runs beside the
request path: the control loop, the lease timer, the SLO monitor, spot notices and
model-repository reloads."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from mark.agent_sync import SYNC_S
from mark.catalog import Catalog
from mark.clock import WallClock
from mark.cluster import tallies, with_others
from mark.config import Settings
from mark.control import Controller, online_predictor
from mark.control.profiles import rate_options
from mark.control.retiring import StoreRetiring
from mark.ports import Fleet
from mark.reload import reload_models, turned_back
from mark.running import Running, every, store_metrics
from mark.serve.auth import first_key
from mark.serve.dispatcher import Dispatchers
from mark.serve.endpoint import STATE
from mark.state import SqlStore
from mark.state.outbox import unreachable
from mark.world import World

log = logging.getLogger("mark.daemon")

STORE_RETRY_S = 2.0
"""How often a daemon started during a database outage tries the store again."""


async def slo_round(run: Running) -> None:
    """Every 2 s: the spills and misses since the last round to the controller, then the
    SLO monitor's check on the latencies finished, then an early step if the load left
    its plan. While this frontend leads, the other frontends' counts are added
    (``mark.cluster.with_others``): the monitor judges the cluster's requests."""
    if run.controller is None:
        return
    now = WallClock().now()
    latencies = {
        name: served.telemetry.take_latencies()
        for name, served in run.models.items()
        if served.telemetry is not None
    }
    spills = {
        name: served.telemetry.take_spills()
        for name, served in run.models.items()
        if served.telemetry is not None
    }
    misses = tallies(run, now)
    with_others(run, latencies, spills, misses, run.controller.leading(now))
    await run.controller.record_spills(spills)
    await run.controller.record_misses(misses)
    await run.controller.check_slo(WallClock().now(), latencies)
    await run.controller.react(WallClock().now())


async def handle_interruptions(run: Running) -> None:
    """Spot notices from the fleet's stream go to the controller as they arrive."""
    assert run.world.fleet is not None and run.controller is not None
    async for notice in run.world.fleet.interruptions():
        try:
            await run.controller.on_interruption(notice, WallClock().now())
        except Exception:
            log.exception("handling the interruption of %s failed", notice.instance_id)


async def make_controller(
    settings: Settings,
    world: World,
    fleet: Fleet,
    store: SqlStore,
    sources: dict[str, str],
    catalog: Catalog,
) -> Controller:
    """The control loop, rating each offering from the best profile of its type."""
    rated = {
        m.name: await rate_options(settings, m, world, store, sources[m.name], catalog)
        for m in settings.models
    }
    return Controller(
        settings,
        fleet,
        store,
        {name: r.options for name, r in rated.items()},
        boot_s=world.boot_s,
        predictors={m.name: online_predictor(settings) for m in settings.models},
        catalog=catalog,
        standby_capacity={name: r.standby_capacity_rps for name, r in rated.items()},
        fixed_hourly=world.fixed_hourly(catalog),
        profile_sources={name: r.sources for name, r in rated.items()},
    )


async def when_store_answers(run: Running, clock: WallClock) -> None:
    """A daemon started during an outage: migrate and check the store once it answers,
    write what was buffered, read its keys, then start the control loop. A store that
    answers but cannot be used (a newer schema) is logged; the daemon goes on serving."""
    while True:
        try:
            await run.store.prepare(upgrade=True)
            if run.store.outbox is not None:
                run.store.outbox.release()
                await run.store.retry_pending()
            if run.keys is not None:
                run.api_key = await first_key(run.store, run.settings.data_dir, clock.now())
                await run.keys.refresh()
            log.info("the store answers: serving with its keys, planning starts")
            if await start_control(run, clock):
                control_tasks(run, clock)
            return
        except Exception as exc:
            if not unreachable(exc):
                log.exception("the store answers but cannot be used: no control loop")
                return
        await asyncio.sleep(STORE_RETRY_S)


async def start_control(run: Running, clock: WallClock) -> bool:
    """The controller, which first adopts what the cluster owns; whether there is one."""
    world, catalog = run.world, run.catalog
    if not world.control_loop or world.fleet is None or catalog is None:
        return False
    store = run.store
    run.controller = controller = await make_controller(
        run.settings, world, world.fleet, store, run.sources, catalog
    )
    run.runner.app[STATE].more_metrics = lambda: controller.prometheus() + store_metrics(store)
    controller.health = run.health.view
    controller.rollouts.on_version = lambda back: turned_back(
        run.models, run.refused, run.world, back
    )
    # A retired instance first gets no new batch and finishes the ones it has, here and,
    # marked retiring in the store, on every other frontend.
    controller.draining = Dispatchers(
        [s.dispatcher for s in run.models.values() if s.dispatcher is not None],
        StoreRetiring(store, clock, SYNC_S),
    )
    # A restarted daemon plans with the fleet it left behind, never buying it twice.
    adopted = await controller.adopt(clock.now())
    if adopted:
        log.info("adopted %d instance(s) this cluster owns", len(adopted))
    return True


async def reloads(run: Running) -> None:
    """Read the model repository again every ``repository_poll_s`` (0: never by itself),
    and at once on SIGHUP."""
    poll_s = run.settings.repository_poll_s or None
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.reload_now.wait(), poll_s)
        run.reload_now.clear()
        try:
            await reload_models(run)
        except Exception:  # one failed read must not stop the polls; the next one retries
            log.exception("reading the model repository again failed")
        run.reloads += 1


def control_tasks(run: Running, clock: WallClock) -> None:
    """The control loop, the SLO monitor and spot notices, as tasks stopped by a drain."""
    controller, world = run.controller, run.world
    if controller is None:
        return
    run.tasks.append(asyncio.create_task(controller.run(clock)))
    run.tasks.append(asyncio.create_task(controller.hold_lease(clock)))
    run.tasks.append(asyncio.create_task(every(2.0, "SLO monitor", lambda: slo_round(run))))
    run.tasks.append(asyncio.create_task(handle_interruptions(run)))
    if world.interruptions is not None:
        leads = lambda: controller.leading(clock.now())  # noqa: E731
        run.tasks.append(asyncio.create_task(world.interruptions.run(leads)))
