"""The daemon's lifecycle: store, world, dispatchers, control loop, API; clean stop on a signal.

In the local world (the default) the daemon starts an embedded moto server as
EC2, launches through the same ``AwsFleet`` adapter it uses on AWS, turns each
running instance into an agent process, and spills to real awslambdaric
runtimes. In the aws world (``mark.cloud.aws.world``) the same daemon launches
through the stack's launch template, finds agents at their instances' private
addresses, hears spot notices from SQS and from the agents' IMDS polls, spills
to the Lambda function and publishes CloudWatch metrics. In both, a (re)start
first adopts the fleet this cluster's tags say it owns. Telemetry is flushed to
the store every P_s and Lambda charges to the ledger; the control loop runs
every P_u.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from bouncer.latency import BatchLatency
from bouncer.runner import ModelRunner
from mark.api.app import STATE, Served, build_app
from mark.billing import provisioned_hourly
from mark.catalog import Market, load_catalog
from mark.clock import WallClock
from mark.cloud.aws.world import AwsWorld
from mark.cloud.local.agents import AgentModel, default_slowdown
from mark.cloud.local.world import LocalWorld
from mark.config import ModelSpec, Settings
from mark.control import (
    LIVE,
    Controller,
    build_options,
    online_predictor,
)
from mark.demo import DEMO_SOURCE, ensure_demo_model
from mark.dispatcher import Backend, Dispatcher
from mark.errors import ConfigError, UnknownOffering
from mark.ports import Serverless
from mark.state import SqlStore, open_store
from mark.telemetry import Telemetry
from provisioner.batching import PROFILE_BATCHES, serving_batching

log = logging.getLogger("mark.daemon")


def resolve_source(spec: ModelSpec, data_dir: Path) -> str:
    """The model file every process loads; the demo model is built here, once, if missing."""
    if spec.source == DEMO_SOURCE:
        return str(ensure_demo_model(data_dir))
    return spec.source


def measure_latency(source: str, spec: ModelSpec) -> BatchLatency:
    """T_b of this model on this machine (real inference, warm-up, median of runs)."""
    runner = ModelRunner(source)
    return runner.profile(np.zeros(spec.input.shape, dtype=spec.input.dtype), PROFILE_BATCHES)


def backend_for(
    instance_id: str, instance_type: str, url: str, latency: BatchLatency, rt_max_s: float
) -> Backend:
    """A dispatcher backend with N_batch and W_batch tuned from the agent's own profile."""
    n, w = serving_batching(latency, rt_max_s)
    return Backend(instance_id, instance_type, url, latency, n_batch=n, w_batch_s=w)


def serving(
    settings: Settings,
    clock: Callable[[], float],
    session: aiohttp.ClientSession,
    serverless: Serverless | None,
) -> dict[str, Served]:
    """A started dispatcher and its telemetry per configured model: the request path."""
    models: dict[str, Served] = {}
    for m in settings.models:
        tel = Telemetry(
            m.name,
            m.slo.rt_max_ms,
            settings.timings.sample_window_s,
            recent_size=settings.slo_monitor.last_m,
            started_at=clock(),
        )
        disp = Dispatcher(
            m.name, m.slo.rt_max_ms / 1000.0, m.input.dtype, clock, session, serverless, tel
        )
        disp.start()
        models[m.name] = Served(m, disp, tel)
    return models


async def start_api(
    settings: Settings, models: dict[str, Served]
) -> tuple[web.AppRunner, tuple[str, int]]:
    """The REST endpoint on ``settings.api``; returns the runner and the bound address."""
    runner = web.AppRunner(build_app(settings, models), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.api.host, settings.api.port)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, (str(host), int(port))


@dataclass
class Running:
    """Everything the daemon started, so a test (or ``serve``) can reach it."""

    settings: Settings
    store: SqlStore
    world: LocalWorld | AwsWorld
    session: aiohttp.ClientSession
    models: dict[str, Served]
    runner: web.AppRunner
    url: str
    controller: Controller | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


async def _flush(run: Running, everything: bool = False) -> None:
    now = WallClock().now()
    for served in run.models.values():
        if served.telemetry is None:
            continue
        windows, rollups = served.telemetry.drain(now, everything=everything)
        if windows:
            await run.store.add_arrivals(windows)
        for r in rollups:
            await run.store.add_latency_rollup(r)
        if isinstance(run.world, AwsWorld) and run.world.metrics is not None:
            run.world.metrics.observe(windows, rollups)
    if run.world.serverless is not None:
        charges = run.world.serverless.take_charges()
        if charges:
            await run.store.add_charges(charges)


async def _publish_metrics(run: Running) -> None:
    """One CloudWatch period: arrivals and SLO from telemetry, cost of the live fleet now."""
    world = run.world
    if not isinstance(world, AwsWorld) or world.metrics is None or world.agents is None:
        return
    catalog = run.controller.catalog if run.controller is not None else load_catalog()
    cost: dict[str, float] = {name: 0.0 for name in run.models}
    for inst in world.agents.instances:
        if inst.state in LIVE and inst.model in cost:
            try:
                cost[inst.model] += catalog.offering(inst.instance_type, inst.market).price_per_hour
            except UnknownOffering:
                continue
    world.metrics.set_cost_rate(cost)
    await world.metrics.publish(WallClock().now())


async def _every(seconds: float, what: str, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    while True:
        await asyncio.sleep(seconds)
        try:
            await fn()
        except Exception:  # one failed round must not stop the daemon; the next one retries
            log.exception("%s failed", what)


async def _sync_backends(run: Running) -> None:
    agents = run.world.agents
    if agents is None:
        return
    await agents.sync()
    for name, served in run.models.items():
        if served.dispatcher is None:
            continue
        rt_max_s = served.spec.slo.rt_max_ms / 1000.0
        served.dispatcher.set_backends(
            [
                backend_for(iid, a.instance.instance_type, a.url, a.latency, rt_max_s)
                for iid, a in agents.agents.items()
                if a.instance.model == name
            ]
        )


async def _slo(run: Running) -> None:
    if run.controller is None:
        return
    latencies = {
        name: served.telemetry.take_latencies()
        for name, served in run.models.items()
        if served.telemetry is not None
    }
    await run.controller.check_slo(WallClock().now(), latencies)


async def _handle_interruptions(run: Running) -> None:
    """Spot notices from the fleet's stream go to the controller as they arrive."""
    assert run.world.fleet is not None and run.controller is not None
    async for notice in run.world.fleet.interruptions():
        try:
            await run.controller.on_interruption(notice, WallClock().now())
        except Exception:
            log.exception("handling the interruption of %s failed", notice.instance_id)


async def start(settings: Settings) -> Running:
    if settings.world not in ("local", "aws"):
        raise ConfigError(
            f"world {settings.world!r} cannot run as a daemon; use 'local' or 'aws' "
            "(the simulator runs the sim world)"
        )
    store = await open_store(settings.db_url, upgrade=True)
    clock = WallClock()
    catalog = load_catalog()
    sources = {m.name: resolve_source(m, settings.data_dir) for m in settings.models}
    world: LocalWorld | AwsWorld
    if settings.world == "aws":
        world = AwsWorld(settings, clock.now)
    else:
        world = LocalWorld(
            settings.aws.region,
            catalog,
            {
                m.name: AgentModel(sources[m.name], tuple(m.input.shape), m.input.dtype)
                for m in settings.models
            },
            clock.now,
            boot_delay_s=settings.local.boot_delay_s,
            lambda_env={"MARK_DATA_DIR": str(settings.data_dir)},
            lambda_concurrency=settings.local.lambda_concurrency,
            lambda_memory_mb=settings.local.lambda_memory_mb,
            slowdown=settings.local.slowdown,
        )
    try:
        await world.start()
    except BaseException:
        await world.close()
        await store.close()
        raise
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
    models = serving(settings, clock.now, session, world.serverless)
    runner, (host, port) = await start_api(settings, models)
    run = Running(settings, store, world, session, models, runner, f"http://{host}:{port}")

    aws = isinstance(world, AwsWorld)
    if isinstance(world, AwsWorld):
        offered = settings.offerings
        catalog = await world.prices(
            catalog,
            [*offered.types, *offered.standby_types, settings.slo_monitor.instance_type],
        )
    if (aws or settings.local.control_loop) and world.fleet is not None:
        # Planning estimate: this machine's T_b stretched per type (local: the profile the
        # agents emulate, measured once at world start, not again under load; aws: the
        # documented default rule, until a profile per type is measured).
        slowdown = default_slowdown(catalog, None if aws else settings.local.slowdown)
        boot_s = settings.aws.boot_s if aws else settings.local.boot_delay_s + 5.0
        options = {}
        standby_capacity = {}
        for m in settings.models:
            if isinstance(world, LocalWorld) and m.name in world.profiles:
                measured = world.profiles[m.name]  # exactly what every agent emulates
            else:
                measured = await asyncio.to_thread(measure_latency, sources[m.name], m)
            types = [*settings.offerings.types, *settings.offerings.standby_types]
            latency = {t: measured.scaled(slowdown(t)) for t in types}
            standby = build_options(
                m,
                catalog,
                settings.offerings.standby_types[:1],
                [Market.ON_DEMAND],
                latency,
                boot_s=boot_s,
            )
            standby_capacity[m.name] = standby[0].capacity_rps if standby else 0.0
            options[m.name] = build_options(
                m,
                catalog,
                settings.offerings.types,
                settings.offerings.markets,
                latency,
                boot_s=boot_s,
            )
        run.controller = Controller(
            settings,
            world.fleet,
            store,
            options,
            boot_s=boot_s,
            predictors={m.name: online_predictor(settings) for m in settings.models},
            catalog=catalog,
            standby_capacity=standby_capacity,
            fixed_hourly=(
                provisioned_hourly(
                    catalog.lambda_prices,
                    settings.aws.spill_provisioned_concurrency,
                    settings.aws.spill_memory_mb,
                )
                if aws
                else 0.0
            ),
        )
        runner.app[STATE].more_metrics = run.controller.prometheus
        # A restarted daemon plans with the fleet it left behind, never buying it twice.
        adopted = await run.controller.adopt(clock.now())
        if adopted:
            log.info("adopted %d instance(s) this cluster owns", len(adopted))
        run.tasks.append(asyncio.create_task(run.controller.run(clock)))
        run.tasks.append(asyncio.create_task(_every(2.0, "SLO monitor", lambda: _slo(run))))
        run.tasks.append(asyncio.create_task(_handle_interruptions(run)))
        if world.interruptions is not None:
            run.tasks.append(asyncio.create_task(world.interruptions.run()))
    run.tasks.append(asyncio.create_task(_every(1.0, "agent sync", lambda: _sync_backends(run))))
    if isinstance(world, AwsWorld) and settings.aws.spill_warm_every_s > 0:
        run.tasks.append(
            asyncio.create_task(
                _every(settings.aws.spill_warm_every_s, "spill warm-up", world.warm_up)
            )
        )
    if isinstance(world, AwsWorld) and world.metrics is not None:
        period = settings.aws.metrics_period_s
        run.tasks.append(
            asyncio.create_task(_every(period, "CloudWatch metrics", lambda: _publish_metrics(run)))
        )
    run.tasks.append(
        asyncio.create_task(
            _every(settings.timings.sample_window_s, "telemetry flush", lambda: _flush(run))
        )
    )
    return run


async def stop(run: Running) -> None:
    """Stop taking requests, answer what is queued, flush telemetry, stop every child."""
    for task in run.tasks:
        task.cancel()
    for task in run.tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await run.runner.shutdown()
    for served in run.models.values():
        if served.dispatcher is not None:
            await served.dispatcher.close()
    with contextlib.suppress(Exception):
        await _flush(run, everything=True)
    with contextlib.suppress(Exception):
        await _publish_metrics(run)  # the last, partial period too
    await run.runner.cleanup()
    await run.session.close()
    await run.world.close()
    await run.store.close()


async def serve(settings: Settings, on_ready: Callable[[str], None] | None = None) -> None:
    """Run until SIGINT/SIGTERM; every resource opened here is closed on the way out."""
    stop_event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_event.set)
    run = await start(settings)
    try:
        if on_ready is not None:
            on_ready(run.url)
        await stop_event.wait()
    finally:
        await stop(run)
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
