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

Start: the API listens at once (liveness answers), but readiness is false and
inference is refused with 503 + ``Retry-After`` until the first agent sync has
ended (bounded by ``api.sync_wait_s``), so a restarted daemon serves with the
instances that run instead of spilling everything until its next sync; the
control loop starts after that sync too, seeing which instances serve. With no
agents (none running, or a world without them) the sync ends at once.

Stop (SIGTERM, SIGINT, ``stop``): a drain. Readiness is false at once and new
inference gets 503 + ``Retry-After``; the control loop and the world's jobs stop;
what the endpoint took runs to its outcome (instances, spills; agent syncs go on)
for at most ``api.drain_s``, by default the dispatcher's outcome bound + 1 s, by
which every request taken has its outcome anyway; then the dispatchers close
(whatever is left: an explicit error), the handlers write their answers, and
everything the daemon opened is closed. Every request taken gets exactly one
answer. A second signal cuts the drain short.

A database outage does not stop serving: the request path never waits on the store
(keys are cached, telemetry is in memory, agent syncs update the dispatcher before they
write), bookkeeping the store cannot take is buffered (``mark.state.outbox``, bounded by
``database_buffer_rows``) and written when it answers, and the control loop holds the
fleet meanwhile (``Controller``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from mark.agent_sync import AGENT_STATES_FROM, backend_for, first_sync, pool_sizes, sync_after
from mark.catalog import load_catalog
from mark.clock import WallClock
from mark.cluster import beat
from mark.config import Settings
from mark.control import resolve_source
from mark.control_tasks import control_tasks, reloads, start_control, when_store_answers
from mark.ports import Serverless
from mark.running import Running, cancel, every, leads, store_metrics
from mark.serve.api_state import model_request_path
from mark.serve.auth import (
    FIRST_KEY_SCOPES,
    KEY_FILE,
    KeyCache,
    first_key,
    hash_secret,
    read_key_file,
    split_token,
)
from mark.serve.endpoint import STATE, Served, build_app
from mark.serve.intake import Intake, Phase
from mark.state import ApiKeyRecord, Outbox, SqlStore, StoreUnreachable, open_store
from mark.state.frontend_store import BEAT_S
from mark.state.store import make_engine
from mark.world import open_world

__all__ = ["AGENT_STATES_FROM", "Running", "backend_for", "pool_sizes", "serve", "start", "stop"]

log = logging.getLogger("mark.daemon")

DRAIN_SLACK_S = 1.0
"""Added to the dispatcher's outcome bound for the default drain: the handlers still
encode their answers after the last outcome."""
ANSWER_WAIT_S = 5.0
"""After the dispatchers close, how long the handlers get to return what they were told."""
SHUTDOWN_TIMEOUT_S = 5.0
"""How long aiohttp waits for responses still being written once the listener closes."""


def freeze_long_lived() -> None:
    """Collect once, then keep what is alive now out of every later cyclic collection.

    Why: a full collection scans every tracked object and stops the event loop while it
    does. The daemon's libraries, models and settings are hundreds of thousands of
    objects that live as long as the process: measured with the modules a daemon
    imports (CPython 3.11, AMD EPYC), a full collection took 142 ms over 266 k
    objects, 0 ms over what a freeze leaves; a request path with RT_max = 100 ms
    cannot absorb the first. Objects frozen here are still freed by reference count.
    """
    gc.collect()
    gc.freeze()


def serving(
    settings: Settings,
    clock: Callable[[], float],
    session: aiohttp.ClientSession,
    serverless: Serverless | None,
) -> dict[str, Served]:
    """A started dispatcher and its telemetry per configured model: the request path."""
    return {
        m.name: model_request_path(settings, m, clock, session, serverless) for m in settings.models
    }


def drain_bound(settings: Settings, models: dict[str, Served]) -> float:
    """How long a drain waits for the requests taken: ``api.drain_s``, else the slowest
    model's outcome bound (every request taken has its outcome by then) + the slack."""
    if settings.api.drain_s is not None:
        return settings.api.drain_s
    bounds = [s.dispatcher.outcome_bound_s for s in models.values() if s.dispatcher is not None]
    return max(bounds, default=0.0) + DRAIN_SLACK_S


async def start_api(
    settings: Settings,
    models: dict[str, Served],
    keys: KeyCache | None = None,
    intake: Intake | None = None,
) -> tuple[web.AppRunner, tuple[str, int]]:
    """The REST endpoint on ``settings.api``; returns the runner and the bound address."""
    app = build_app(settings, models, keys=keys, intake=intake)
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.api.host, settings.api.port)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, (str(host), int(port))


async def _flush(run: Running, everything: bool = False) -> None:
    """Closed telemetry windows, roll-ups and Lambda charges to the store (buffered while
    it cannot be reached: drained once, they are never lost to a failed round)."""
    await run.store.retry_pending()
    now = WallClock().now()
    for served in run.models.values():
        if served.telemetry is None:
            continue
        windows, rollups = served.telemetry.drain(now, everything=everything)
        if windows:
            await run.store.add_arrivals(windows)
        for r in rollups:
            await run.store.add_latency_rollup(r)
        run.world.observe(windows, rollups)
    if run.world.serverless is not None:
        charges = run.world.serverless.take_charges()
        for c in charges:
            charged = run.models.get(c.model)
            if charged is not None and charged.telemetry is not None:
                charged.telemetry.lambda_charged(c.cost)
        if charges:
            await run.store.add_charges(charges)


async def _api_keys(
    settings: Settings, store: SqlStore, now: float
) -> tuple[KeyCache | None, str | None]:
    """The keys the endpoint checks (read now, then every ``api.key_refresh_s``) and the
    daemon's own key (made on a store with none), unless ``api.auth`` is off."""
    if not settings.api.auth:
        _auth_off(settings)
        return None, None
    api_key = await first_key(store, settings.data_dir, now)
    keys = KeyCache.of_store(store)
    await keys.refresh()
    return keys, api_key


def _auth_off(settings: Settings) -> None:
    api = settings.api
    log.warning("api.auth is false: anyone reaching %s:%d may use the API", api.host, api.port)


def _saved_key(
    settings: Settings, store: SqlStore, now: float
) -> tuple[KeyCache | None, str | None]:
    """While the store cannot be reached at start: the daemon's own key from
    ``<data_dir>/api-key``, with the first key's scopes (inference, metrics; never admin),
    is the one key accepted until the store answers and its keys replace it. The file is
    the owner's only (0600) and this daemon wrote it; a key revoked since is accepted
    for that long, and keys made by ``mark keys create`` are not known until then."""
    if not settings.api.auth:
        _auth_off(settings)
        return None, None
    path = settings.data_dir / KEY_FILE
    token = read_key_file(path)
    parts = split_token(token) if token is not None else None
    keys = KeyCache.of_store(store)
    if parts is None:
        log.warning("no API key in %s: every request is refused until the store answers", path)
        return keys, None
    keys.replace([ApiKeyRecord(parts[0], "saved", FIRST_KEY_SCOPES, hash_secret(parts[1]), now)])
    log.warning("until the store answers, the only API key accepted is the one in %s", path)
    return keys, token


async def _open_store(settings: Settings) -> tuple[SqlStore, bool]:
    """The store, and whether it answered and is migrated. One that cannot be reached is
    returned all the same, its writes held (``Outbox.hold``) until ``when_store_answers``
    has migrated and checked it: the daemon serves meanwhile."""
    outbox = Outbox(settings.database_buffer_rows)
    timeouts = {
        "connect_timeout_s": settings.database_connect_timeout_s,
        "statement_timeout_s": settings.database_statement_timeout_s,
    }
    try:
        return await open_store(settings.db_url, upgrade=True, outbox=outbox, **timeouts), True
    except StoreUnreachable as exc:
        log.warning("%s: serving without it; planning starts once it answers", exc)
    outbox.hold()
    return SqlStore(make_engine(settings.db_url, **timeouts), outbox), False


async def start(settings: Settings) -> Running:
    clock = WallClock()
    sources = {m.name: resolve_source(m, settings.data_dir) for m in settings.models}
    world = open_world(settings, sources, clock.now)  # before the store: a bad world fails first
    store, answers = await _open_store(settings)
    try:
        if answers:
            keys, api_key = await _api_keys(settings, store, clock.now())
        else:
            keys, api_key = _saved_key(settings, store, clock.now())
    except BaseException:
        await store.close()
        raise
    try:
        await world.start()
    except BaseException:
        await world.close()
        await store.close()
        raise
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
    models = serving(settings, clock.now, session, world.serverless)
    intake = Intake(Phase.STARTING)  # readiness false, inference refused: not synced yet
    runner, (host, port) = await start_api(settings, models, keys, intake)
    run = Running(
        settings, store, world, session, models, runner, f"http://{host}:{port}", intake=intake
    )
    run.sources, run.api_key, run.keys = sources, api_key, keys
    if keys is not None:
        run.serving_tasks.append(asyncio.create_task(keys.run(settings.api.key_refresh_s)))

    offered = settings.offerings
    catalog = await world.prices(
        load_catalog(),
        [
            *offered.types,
            *offered.standby_types,
            *filter(None, [settings.slo_monitor.instance_type]),
        ],
    )
    run.catalog = catalog
    runner.app[STATE].more_metrics = lambda: store_metrics(store)
    if answers:
        await start_control(run, clock)
    else:  # the control loop waits for the store; serving does not
        run.tasks.append(asyncio.create_task(when_store_answers(run, clock)))
    # Serve (and plan) with the instances that serve now, not with none until a later sync.
    first = await first_sync(run)
    run.serving_tasks.append(asyncio.create_task(sync_after(run, first)))
    freeze_long_lived()  # before the first request, which a full collection would stall
    intake.open()
    control_tasks(run, clock)
    if settings.repository is not None:
        run.tasks.append(asyncio.create_task(reloads(run)))
    run.jobs = world.jobs(catalog, lambda: leads(run, clock))
    for job in run.jobs:
        run.tasks.append(asyncio.create_task(every(job.every_s, job.name, job.run)))
    run.serving_tasks.append(
        asyncio.create_task(
            every(settings.timings.sample_window_s, "telemetry flush", lambda: _flush(run))
        )
    )
    run.serving_tasks.append(
        asyncio.create_task(every(BEAT_S, "frontend beat", lambda: beat(run, clock.now())))
    )
    return run


async def _answered(intake: Intake, within_s: float, hurry: asyncio.Event | None) -> bool:
    """Wait until every request the endpoint took is answered, at most ``within_s`` or
    until ``hurry`` is set; whether none is left."""
    waits: set[asyncio.Task[Any]] = {asyncio.create_task(intake.idle())}
    if hurry is not None:
        waits.add(asyncio.create_task(hurry.wait()))
    try:
        await asyncio.wait(waits, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
    return intake.in_flight == 0


async def stop(run: Running, hurry: asyncio.Event | None = None) -> None:
    """Drain (module docstring), flush telemetry, stop every child. ``hurry``, once set,
    ends the drain's wait early."""
    run.intake.drain()  # readiness 503 now; new inference 503 + Retry-After
    await cancel(run.tasks)  # nothing is launched or retired while draining
    if run.controller is not None:
        with contextlib.suppress(Exception):  # a lapsed lease is the fallback
            await run.controller.resign()  # another controller may act at once
    bound = drain_bound(run.settings, run.models)
    if run.intake.in_flight:
        log.info("draining %d request(s), for at most %g s", run.intake.in_flight, bound)
    if not await _answered(run.intake, bound, hurry):
        log.warning(
            "%d request(s) still unanswered after the drain: answered with an error",
            run.intake.in_flight,
        )
    for served in run.models.values():
        if served.dispatcher is not None:
            await served.dispatcher.close(wait_s=0.0)
    await _answered(run.intake, ANSWER_WAIT_S, None)  # the handlers return those errors
    await cancel(run.serving_tasks)
    with contextlib.suppress(Exception):
        await _flush(run, everything=True)
    if run.store.outbox is not None and run.store.outbox.buffered_rows:
        log.warning(
            "the store still cannot be reached: %d buffered row(s) of bookkeeping lost",
            run.store.outbox.buffered_rows,
        )
    for job in run.jobs:
        if job.at_stop:
            with contextlib.suppress(Exception):
                await job.run()  # e.g. the last, partial metrics period
    await run.runner.cleanup()
    await run.session.close()
    await run.world.close()
    await run.store.close()
    gc.unfreeze()  # a process that goes on (a test, an embedding) collects them again


async def serve(settings: Settings, on_ready: Callable[[Running], None] | None = None) -> None:
    """Run until SIGINT/SIGTERM, then drain and stop (a second signal cuts the drain
    short); every resource opened here is closed on the way out."""
    stop_event = asyncio.Event()
    hurry = asyncio.Event()

    def on_signal() -> None:
        if stop_event.is_set():
            log.warning("second signal: not waiting for the drain")
            hurry.set()
        stop_event.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    run = await start(settings)
    loop.add_signal_handler(signal.SIGHUP, run.reload_now.set)
    try:
        if on_ready is not None:
            on_ready(run)
        await stop_event.wait()
    finally:
        await stop(run, hurry)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
