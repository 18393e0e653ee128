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
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from sqlalchemy.exc import SQLAlchemyError

from bouncer.latency import BatchLatency
from mark.catalog import Catalog, load_catalog
from mark.clock import WallClock
from mark.config import Settings
from mark.control import Controller, online_predictor, resolve_source
from mark.control.health import HealthTracker
from mark.control.profiles import rate_options
from mark.errors import StoreError
from mark.ports import Fleet, Serverless
from mark.reload import reload_models, turned_back
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
from mark.serve.dispatcher import Backend, Dispatchers
from mark.serve.endpoint import STATE, Served, build_app
from mark.serve.intake import Intake, Phase
from mark.state import (
    ApiKeyRecord,
    Outbox,
    ProfileRecord,
    SqlStore,
    StoreUnreachable,
    open_store,
)
from mark.state.outbox import unreachable
from mark.state.store import make_engine
from mark.world import Agents, Job, World, open_world
from provisioner.control_state import MEASURING_ROLES
from provisioner.pool_batching import batching_for, pool_batching

log = logging.getLogger("mark.daemon")

AGENT_STATES_FROM = ("pending", "running", "ready", "draining")
"""What an agent's report may change: never a stopping, stopped or terminated instance."""

DRAIN_SLACK_S = 1.0
"""Added to the dispatcher's outcome bound for the default drain: the handlers still
encode their answers after the last outcome."""
STORE_RETRY_S = 2.0
"""How often a daemon started during a database outage tries the store again."""
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


def backend_for(
    instance_id: str,
    instance_type: str,
    url: str,
    latency: BatchLatency,
    rt_max_s: float,
    *,
    sl_min: float,
    pool_size: int = 1,
) -> Backend:
    """A dispatcher backend with N_batch and W_batch tuned from the agent's own profile,
    for a pool of ``pool_size`` instances of its type (``provisioner.pool_batching``)."""
    n, w = batching_for(latency, rt_max_s, sl_min, pool_size)
    return Backend(instance_id, instance_type, url, latency, n_batch=n, w_batch_s=w)


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


@dataclass
class Running:
    """Everything the daemon started, so a test (or ``serve``) can reach it."""

    settings: Settings
    store: SqlStore
    world: World
    session: aiohttp.ClientSession
    models: dict[str, Served]
    runner: web.AppRunner
    url: str
    controller: Controller | None = None
    intake: Intake = field(default_factory=Intake)
    """The endpoint's phase (starting, open, draining) and the requests it has in hand."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    """Stopped as a drain begins: the control loop and the world's jobs."""
    serving_tasks: list[asyncio.Task[None]] = field(default_factory=list)
    """Kept through the drain, stopped after it: agent syncs, key refresh, telemetry."""
    jobs: list[Job] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # model → the file it loads
    catalog: Catalog | None = None
    profiled: set[tuple[str, str]] = field(default_factory=set)  # (model, type) stored
    health: HealthTracker = field(default_factory=HealthTracker)
    api_key: str | None = None  # the key in <data_dir>/api-key, when it is this store's
    keys: KeyCache | None = None  # what the endpoint checks keys against (api.auth)
    refused: set[tuple[str, str]] = field(default_factory=set)
    """(model, version) a reload refused or a roll turned back from: not tried again."""
    reload_now: asyncio.Event = field(default_factory=asyncio.Event)
    """Set (SIGHUP) to read the model repository again at once."""
    reloads: int = 0
    """How many times the model repository was read again (done, or failed)."""


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


def _store_metrics(store: SqlStore) -> str:
    return store.outbox.prometheus() if store.outbox is not None else ""


def _leads(run: Running, clock: WallClock) -> bool:
    """Whether this frontend leads the cluster now (none without a control loop)."""
    return run.controller is not None and run.controller.leading(clock.now())


async def _every(seconds: float, what: str, fn: Callable[[], Awaitable[None]]) -> None:
    while True:
        await asyncio.sleep(seconds)
        try:
            await fn()
        except Exception:  # one failed round must not stop the daemon; the next one retries
            log.exception("%s failed", what)


def pool_sizes(instances: Iterable[tuple[str, str]], retiring: Collection[str]) -> Counter[str]:
    """How many instances of each type a type's batches may go to, from (id, type) pairs:
    one being retired takes no new batch, so its type's batching is for a pool without it."""
    return Counter(itype for iid, itype in instances if iid not in retiring)


def _measure_pools(latencies: list[BatchLatency], rt_max_s: float, sl_min: float) -> None:
    for latency in latencies:
        pool_batching(latency, rt_max_s, sl_min)  # cached: ``batching_for`` then reads it


async def _sync_backends(run: Running) -> None:
    agents = run.world.agents
    if agents is None:
        return
    await agents.sync()
    # The request path first: the dispatcher's backends never wait on the store.
    for name, served in run.models.items():
        if served.dispatcher is None:
            continue
        rt_max_s = served.spec.slo.rt_max_ms / 1000.0
        mine = [
            (iid, a)
            for iid, a in agents.agents.items()
            if a.instance.model == name and a.instance.role.value not in MEASURING_ROLES
        ]
        of_type = pool_sizes(
            ((iid, a.instance.instance_type) for iid, a in mine), served.dispatcher.retiring
        )
        pooled = [a.latency for _, a in mine if of_type[a.instance.instance_type] > 1]
        # A profile's pool batching is measured on the perf model's queue, seconds the
        # first time: off the event loop, so the request path never waits on it.
        await asyncio.to_thread(_measure_pools, pooled, rt_max_s, served.spec.slo.sl_min)
        served.dispatcher.set_backends(
            [
                backend_for(
                    iid,
                    a.instance.instance_type,
                    a.url,
                    a.latency,
                    rt_max_s,
                    sl_min=served.spec.slo.sl_min,
                    pool_size=of_type[a.instance.instance_type],
                )
                for iid, a in mine
            ]
        )
    now = WallClock().now()
    ready, failing = run.health.observe(now, agents.instance_ids, agents.agents)
    for iid, state, why in [
        *((i, "ready", "agent ready: model loaded, profiled, one inference passed") for i in ready),
        *(
            (i, "draining", "agent failing its liveness probe, or gone: no new batches")
            for i in failing
        ),
    ]:
        with contextlib.suppress(StoreError):  # an instance the store has not recorded yet
            await run.store.set_instance_state(
                iid, state, now, reason=why, only_from=AGENT_STATES_FROM
            )
    if run.world.agents_measure:
        await _store_measured_profiles(run, agents)


async def _store_measured_profiles(run: Running, agents: Agents) -> None:
    """Keep each agent's first profile of its (model, type), measured on that type, and
    re-rate that model's offerings from it: the planner's capacity is then measured.
    Instances launched only to measure (exploring, ``mark profile --type``) count too;
    they serve no requests."""
    changed = set()
    now = WallClock().now()
    for a in agents.agents.values():
        key = (a.instance.model, a.instance.instance_type)
        if key in run.profiled or a.instance.model not in run.models:
            continue
        run.profiled.add(key)
        await run.store.put_profile(
            ProfileRecord(key[0], key[1], "measured", a.latency.points, now)
        )
        changed.add(key[0])
    if run.controller is None or run.catalog is None:
        return
    for name in changed:
        spec = run.settings.model(name)
        try:
            rated = await rate_options(
                run.settings, spec, run.world, run.store, run.sources[name], run.catalog
            )
        except (StoreError, SQLAlchemyError, OSError) as exc:  # out: re-rated at a later sync
            run.profiled -= {k for k in run.profiled if k[0] == name}
            log.warning("%s: offerings not re-rated yet: %s", name, exc)
            continue
        await run.controller.set_options(
            name, rated.options, rated.sources, rated.standby_capacity_rps
        )
        log.info("%s: offerings re-rated from measured profiles: %s", name, rated.sources)


async def _slo(run: Running) -> None:
    if run.controller is None:
        return
    latencies = {
        name: served.telemetry.take_latencies()
        for name, served in run.models.items()
        if served.telemetry is not None
    }
    await run.controller.record_spills(
        {
            name: served.telemetry.take_spills()
            for name, served in run.models.items()
            if served.telemetry is not None
        }
    )
    now = WallClock().now()
    await run.controller.record_misses(
        {
            name: served.dispatcher.budget.tally(now)
            for name, served in run.models.items()
            if served.dispatcher is not None and served.dispatcher.budget is not None
        }
    )
    await run.controller.check_slo(WallClock().now(), latencies)
    await run.controller.react(WallClock().now())


async def _handle_interruptions(run: Running) -> None:
    """Spot notices from the fleet's stream go to the controller as they arrive."""
    assert run.world.fleet is not None and run.controller is not None
    async for notice in run.world.fleet.interruptions():
        try:
            await run.controller.on_interruption(notice, WallClock().now())
        except Exception:
            log.exception("handling the interruption of %s failed", notice.instance_id)


async def _controller(
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
    returned all the same, its writes held (``Outbox.hold``) until ``_when_store_answers``
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


async def _when_store_answers(run: Running, clock: WallClock) -> None:
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
            if await _start_control(run, clock):
                _control_tasks(run, clock)
            return
        except Exception as exc:
            if not unreachable(exc):
                log.exception("the store answers but cannot be used: no control loop")
                return
        await asyncio.sleep(STORE_RETRY_S)


async def _start_control(run: Running, clock: WallClock) -> bool:
    """The controller, which first adopts what the cluster owns; whether there is one."""
    world, catalog = run.world, run.catalog
    if not world.control_loop or world.fleet is None or catalog is None:
        return False
    store = run.store
    run.controller = controller = await _controller(
        run.settings, world, world.fleet, store, run.sources, catalog
    )
    run.runner.app[STATE].more_metrics = lambda: controller.prometheus() + _store_metrics(store)
    controller.health = run.health.view
    controller.rollouts.on_version = lambda back: turned_back(
        run.models, run.refused, run.world, back
    )
    # A retired instance first gets no new batch and finishes the ones it has.
    controller.draining = Dispatchers(
        [s.dispatcher for s in run.models.values() if s.dispatcher is not None]
    )
    # A restarted daemon plans with the fleet it left behind, never buying it twice.
    adopted = await controller.adopt(clock.now())
    if adopted:
        log.info("adopted %d instance(s) this cluster owns", len(adopted))
    return True


async def _reloads(run: Running) -> None:
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


def _control_tasks(run: Running, clock: WallClock) -> None:
    """The control loop, the SLO monitor and spot notices, as tasks stopped by a drain."""
    controller, world = run.controller, run.world
    if controller is None:
        return
    run.tasks.append(asyncio.create_task(controller.run(clock)))
    run.tasks.append(asyncio.create_task(controller.hold_lease(clock)))
    run.tasks.append(asyncio.create_task(_every(2.0, "SLO monitor", lambda: _slo(run))))
    run.tasks.append(asyncio.create_task(_handle_interruptions(run)))
    if world.interruptions is not None:
        leads = lambda: controller.leading(clock.now())  # noqa: E731
        run.tasks.append(asyncio.create_task(world.interruptions.run(leads)))


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
    runner.app[STATE].more_metrics = lambda: _store_metrics(store)
    if answers:
        await _start_control(run, clock)
    else:  # the control loop waits for the store; serving does not
        run.tasks.append(asyncio.create_task(_when_store_answers(run, clock)))
    # Serve (and plan) with the instances that serve now, not with none until a later sync.
    first = await _first_sync(run)
    run.serving_tasks.append(asyncio.create_task(_sync_after(run, first)))
    freeze_long_lived()  # before the first request, which a full collection would stall
    intake.open()
    _control_tasks(run, clock)
    if settings.repository is not None:
        run.tasks.append(asyncio.create_task(_reloads(run)))
    run.jobs = world.jobs(catalog, lambda: _leads(run, clock))
    for job in run.jobs:
        run.tasks.append(asyncio.create_task(_every(job.every_s, job.name, job.run)))
    run.serving_tasks.append(
        asyncio.create_task(
            _every(settings.timings.sample_window_s, "telemetry flush", lambda: _flush(run))
        )
    )
    return run


async def _first_sync(run: Running) -> asyncio.Task[None]:
    """The first agent sync, waited for at most ``api.sync_wait_s``; past that the
    endpoint serves anyway (spilling) and the sync goes on. Returns its task."""
    task = asyncio.create_task(_sync_backends(run), name="first agent sync")
    bound = run.settings.api.sync_wait_s
    await asyncio.wait({task}, timeout=bound)
    if not task.done():
        log.warning(
            "the first agent sync took over %g s: serving now, spilling until it ends", bound
        )
    return task


async def _sync_after(run: Running, first: asyncio.Task[None]) -> None:
    """Agent syncs every second, once the first one has ended (never two at once)."""
    try:
        await first
    except Exception:
        log.exception("the first agent sync failed; the next one retries")
    await _every(1.0, "agent sync", lambda: _sync_backends(run))


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


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
    await _cancel(run.tasks)  # nothing is launched or retired while draining
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
    await _cancel(run.serving_tasks)
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
