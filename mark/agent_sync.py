"""The agent sync: each model's dispatcher backends from the agents that serve it, with
N_batch and W_batch tuned from each agent's own profile for its pool, the instances the
store marks retiring withheld from them (``mark.control.retiring``), and what the agents
report (ready, failing, their measured profiles) recorded in the store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable

from sqlalchemy.exc import SQLAlchemyError

from bouncer.latency import BatchLatency
from mark.clock import WallClock
from mark.control.profiles import rate_options
from mark.control.retiring import MARK_READ, marks
from mark.errors import StoreError
from mark.ports import Store
from mark.running import Running, every
from mark.serve.dispatcher import Backend, Dispatcher
from mark.state import ProfileRecord
from mark.world import Agents
from provisioner.control_state import MEASURING_ROLES
from provisioner.pool_batching import batching_for, pool_batching

log = logging.getLogger("mark.daemon")

AGENT_STATES_FROM = ("pending", "running", "ready", "draining")
"""What an agent's report may change: never a retiring (the leader's mark), stopping,
stopped or terminated instance."""
SYNC_S = 1.0
"""How often the agent sync runs: how soon a frontend reads a retiring mark."""


def backend_for(
    instance_id: str,
    instance_type: str,
    url: str,
    latency: BatchLatency,
    rt_max_s: float,
    *,
    sl_min: float,
    pool_size: int = 1,
    variants: dict[str, BatchLatency] | None = None,
) -> Backend:
    """A dispatcher backend with N_batch and W_batch tuned from the agent's own profile,
    for a pool of ``pool_size`` instances of its type (``provisioner.pool_batching``);
    ``variants``: T_b of the model's other variants the agent loaded."""
    n, w = batching_for(latency, rt_max_s, sl_min, pool_size)
    return Backend(
        instance_id, instance_type, url, latency, n_batch=n, w_batch_s=w, variants=variants or {}
    )


def pool_sizes(instances: Iterable[tuple[str, str]], retiring: Collection[str]) -> Counter[str]:
    """How many instances of each type a type's batches may go to, from (id, type) pairs:
    one being retired takes no new batch, so its type's batching is for a pool without it."""
    return Counter(itype for iid, itype in instances if iid not in retiring)


def _measure_pools(latencies: list[BatchLatency], rt_max_s: float, sl_min: float) -> None:
    for latency in latencies:
        pool_batching(latency, rt_max_s, sl_min)  # cached: ``batching_for`` then reads it


async def sync_backends(run: Running) -> None:
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
                    variants=a.variants,
                )
                for iid, a in mine
            ]
        )
    # Then what the leader is about to end: read here, never on the request path.
    dispatchers = [s.dispatcher for s in run.models.values() if s.dispatcher is not None]
    read = await read_marks(run.store, dispatchers, WallClock().now)
    if read is not None:
        run.synced_at = read
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


async def read_marks(
    store: Store, dispatchers: Iterable[Dispatcher], clock: Callable[[], float]
) -> float | None:
    """One read of the store's retiring marks, applied: the marked instances get no new
    batch, those the store lists serving again are released. Returns when the read began
    (every mark made before then is applied: the ``synced_at`` the leader waits on), or None
    if the store did not answer (the marks last read stay)."""
    began = clock()
    try:
        marked, serving = marks(await store.instances(states=MARK_READ))
    except (StoreError, SQLAlchemyError, OSError) as exc:
        log.debug("retiring marks not read: %s", exc)
        return None
    for d in dispatchers:
        d.withhold(marked)
        d.release(serving)
    return began


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


async def first_sync(run: Running) -> asyncio.Task[None]:
    """The first agent sync, waited for at most ``api.sync_wait_s``; past that the
    endpoint serves anyway (spilling) and the sync goes on. Returns its task."""
    task = asyncio.create_task(sync_backends(run), name="first agent sync")
    bound = run.settings.api.sync_wait_s
    await asyncio.wait({task}, timeout=bound)
    if not task.done():
        log.warning(
            "the first agent sync took over %g s: serving now, spilling until it ends", bound
        )
    return task


async def sync_after(run: Running, first: asyncio.Task[None]) -> None:
    """Agent syncs every second, once the first one has ended (never two at once)."""
    try:
        await first
    except Exception:
        log.exception("the first agent sync failed; the next one retries")
    await every(SYNC_S, "agent sync", lambda: sync_backends(run))
