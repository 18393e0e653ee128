"""The daemon's lifecycle: store, spill function, dispatchers, API; clean stop on a signal.

What is wired today: the REST endpoint, one dispatcher per model, the spill
function (the local world runs it under awslambdaric), telemetry flushed to
the store every P_s and Lambda charges to the ledger. The control loop that
launches instances plugs in through ``Dispatcher.set_backends``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from mark.api.app import Served, build_app
from mark.clock import WallClock
from mark.cloud.local.lambda_runtime import LocalLambda
from mark.config import ModelSpec, Settings
from mark.demo import DEMO_SOURCE, ensure_demo_model
from mark.dispatcher import Dispatcher
from mark.errors import ConfigError
from mark.state import SqlStore, open_store
from mark.telemetry import Telemetry

log = logging.getLogger("mark.daemon")


def resolve_source(spec: ModelSpec, data_dir: Path) -> str:
    """The model file every process loads; the demo model is built here, once, if missing."""
    if spec.source == DEMO_SOURCE:
        return str(ensure_demo_model(data_dir))
    return spec.source


@dataclass
class Running:
    """Everything the daemon started, so a test (or ``serve``) can reach it."""

    settings: Settings
    store: SqlStore
    serverless: LocalLambda | None
    session: aiohttp.ClientSession
    models: dict[str, Served]
    runner: web.AppRunner
    url: str


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
    if run.serverless is not None:
        charges = run.serverless.take_charges()
        if charges:
            await run.store.add_charges(charges)


async def _flusher(run: Running) -> None:
    while True:
        await asyncio.sleep(run.settings.timings.sample_window_s)
        try:
            await _flush(run)
        except Exception:  # a store hiccup must not stop serving; the next flush retries
            log.exception("telemetry flush failed")


async def start(settings: Settings) -> Running:
    if settings.world == "aws":
        raise ConfigError("world 'aws' is not available yet; use 'local' (or 'sim')")
    store = await open_store(settings.db_url, upgrade=True)
    clock = WallClock()
    sources = {m.name: resolve_source(m, settings.data_dir) for m in settings.models}
    serverless = LocalLambda(sources, env={"MARK_DATA_DIR": str(settings.data_dir)})
    await serverless.start()
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
    models: dict[str, Served] = {}
    for m in settings.models:
        tel = Telemetry(
            m.name,
            m.slo.rt_max_ms,
            settings.timings.sample_window_s,
            recent_size=settings.slo_monitor.last_m,
        )
        disp = Dispatcher(
            m.name, m.slo.rt_max_ms / 1000.0, m.input.dtype, clock.now, session, serverless, tel
        )
        disp.start()
        models[m.name] = Served(m, disp, tel)
    runner = web.AppRunner(build_app(settings, models), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.api.host, settings.api.port)
    await site.start()
    host, port = runner.addresses[0][:2]
    return Running(settings, store, serverless, session, models, runner, f"http://{host}:{port}")


async def stop(run: Running) -> None:
    """Stop taking requests, answer what is queued, flush telemetry, kill every child."""
    await run.runner.shutdown()
    for served in run.models.values():
        if served.dispatcher is not None:
            await served.dispatcher.close()
    with contextlib.suppress(Exception):
        await _flush(run, everything=True)
    await run.runner.cleanup()
    await run.session.close()
    if run.serverless is not None:
        await run.serverless.close()
    await run.store.close()


async def serve(settings: Settings, on_ready: Callable[[str], None] | None = None) -> None:
    """Run until SIGINT/SIGTERM; every resource opened here is closed on the way out."""
    stop_event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_event.set)
    run = await start(settings)
    flusher = asyncio.create_task(_flusher(run))
    try:
        if on_ready is not None:
            on_ready(run.url)
        await stop_event.wait()
    finally:
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher
        await stop(run)
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
