"""The ``mark`` policies in the simulator: the daemon's own ``Controller``.

``mark``, ``mark-spot`` and their ablations (``reactive``, ``no-lambda``,
``no-batching``, ``no-prediction``) run the controller the daemon runs, on
the simulated world's ``SimFleet`` and store: every P_u its ``step`` (after
the arrivals counted since the last step are written to the store, as the
daemon's telemetry writes them), every ``slo_check_s`` its ``record_spills``
on the spilled requests and Lambda charges since the last check and its
``check_slo`` on their latencies, as the daemon's SLO task does, and its
``on_interruption`` on each spot notice. Only the clock and the cloud are simulated.

History before the warm-up (``history_minutes`` of P_s windows) is pre-loaded
into the store, as a daemon that has run for a day would have it.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from mark.catalog import Market
from mark.config import BudgetSpec, OfferingsSpec, PlannerSpec, Settings, Timings
from mark.control import Controller
from mark.ports import InterruptionNotice
from mark.sim.bound import SLO_EPS_S
from mark.sim.engine import DECLINED, LAMBDA
from mark.sim.loop import PolicyEvents, run_loop
from mark.sim.world import Extra, SimWorld
from predictor.base import Forecaster
from predictor.baselines import LastValue
from predictor.online import OnlinePredictor, RefitPolicy
from provisioner.options import planner_option
from provisioner.perf_model import InstancePerf
from provisioner.spill_evidence import SpillCounts
from provisioner.standby_value import HOURS_PER_MONTH


def sim_settings(world: SimWorld) -> Settings:
    """The daemon's settings for this world: its model, offerings and standbys."""
    standby = (world.cfg.standby_type,) if world.policy.standbys else ()
    return Settings(
        world="sim",
        models=(world.model.spec(),),
        offerings=OfferingsSpec(
            types=tuple(sorted({o.instance_type for o in world.options})),
            markets=tuple(Market(m) for m in world.policy.markets),
            standby_types=standby,
            max_instances=world.cfg.max_instances,
            volume_gb=world.cfg.volume_gb,
            # The daemon is told the world's rate, as a user configures the Advisor's: the
            # highest of its spot types' (one number, as the setting is).
            **(
                {"spot_interruption_rate": spot_rate * HOURS_PER_MONTH}
                if (spot_rate := _spot_rate(world)) > 0
                else {}
            ),
        ),
        # The paper's experiments measure the policy, not a user's budget: no spend rails.
        budget=BudgetSpec(max_hourly_per_model=None, max_hourly_cluster=None),
        planner=PlannerSpec(
            pooled_capacity=world.cfg.pooled_capacity,
            spill_capacity_target=world.cfg.capacity_target,
            rise_by_misses=world.cfg.rise_by_misses,
        ),
        timings=Timings(
            early_steps=world.cfg.early_steps,
            cooldown_s=world.cfg.cooldown_s,
            warm_start_s=world.cfg.standby_start_s if world.cfg.warm_pool else None,
        ),
    )


def _spot_rate(world: SimWorld) -> float:
    """The highest interruption rate per instance-hour among the world's spot offerings."""
    spot = {o.instance_type for o in world.options if o.market == Market.SPOT.value}
    return max((world.interrupt_rate(t) for t in spot), default=0.0)


def standby_capacity(world: SimWorld) -> float:
    """What one started standby serves within the SLO, one request at a time."""
    itype = world.cfg.standby_type
    curve = world.model.standby_latency(world.catalog.types[itype].vcpus)
    price = world.catalog.offering(itype, Market.ON_DEMAND).price_per_hour
    opt = planner_option(
        itype,
        "on-demand",
        price,
        InstancePerf(curve(1), 1, 0.0),
        rt_max_s=world.model.rt_max_s,
        sl_min=world.model.sl_min,
    )
    return opt.capacity_rps


def _fixed_predictor(forecaster: Forecaster) -> OnlinePredictor:
    """An online predictor that forecasts with ``forecaster`` and never refits mid-run."""
    online = OnlinePredictor(
        lambda: forecaster,
        RefitPolicy(every_minutes=10**9, min_history=10**9),
    )
    online.model = forecaster
    online.last_fit = 0
    return online


async def drive_mark(world: SimWorld, forecaster: Forecaster | None) -> Extra:
    """Run the daemon's controller on ``world``; ``forecaster`` is the trained predictor
    (None: the controller's own default), unused when the policy does not predict."""
    settings = sim_settings(world)
    policy, model, store = world.policy, world.model.name, world.store
    await store.add_arrivals(world.history_windows(world.cfg.history_minutes))
    predictors: dict[str, OnlinePredictor] = {}
    if policy.prediction and forecaster is not None:
        predictors[model] = _fixed_predictor(forecaster)
    ctl = Controller(
        settings,
        world.fleet,
        store,
        {model: world.options},
        predictors=predictors,
        boot_s=world.cfg.boot_s,
        catalog=world.catalog,
        standby_capacity={model: standby_capacity(world)} if policy.standbys else {},
    )
    if not policy.prediction:
        ctl.forecast = LastValue()
    sample = settings.timings.sample_window_s
    flushed = world.t_begin

    async def flush(t: float) -> None:
        # The P_s windows closed by ``t``, as the daemon's telemetry writes them.
        nonlocal flushed
        await store.add_arrivals(world.windows_between(flushed, t))
        flushed = t - (t - world.t_begin) % sample

    async def on_step(t: float) -> None:
        await flush(t)
        await ctl.step(t)

    lam = world.lam
    billed, throttled = lam.cost, lam.throttled_requests

    async def on_slo(t: float, lat: NDArray[np.float64], where: NDArray[np.int8]) -> None:
        # What the daemon's telemetry gives it: spilled requests ended, within RT_max or
        # not (a throttled spill fails), and what Lambda billed since the last look.
        nonlocal billed, throttled
        on_lambda = lat[where == LAMBDA]
        spills = SpillCounts(
            int(on_lambda.size) + lam.throttled_requests - throttled,
            int(np.count_nonzero(on_lambda <= world.model.rt_max_s + SLO_EPS_S)),
            lam.cost - billed,
        )
        billed, throttled = lam.cost, lam.throttled_requests
        await ctl.record_spills({model: spills})
        budget = world.engine.budget
        if budget is not None:
            await ctl.record_misses({model: budget.count(t)})
        # Declined requests were the miss budget's choice, not a sign of too few instances.
        served = lat[where != DECLINED]
        await flush(t)  # the closed P_s windows, which early steps and backups read
        if policy.slo_monitor and served.size:
            await ctl.check_slo(t, {model: served.tolist()})
        if settings.timings.early_steps:
            await ctl.react(t)

    async def on_interruption(notice: InterruptionNotice) -> None:
        await ctl.on_interruption(notice, world.clock.t)

    await run_loop(
        world,
        PolicyEvents(
            settings.timings.update_period_s,
            on_step,
            on_slo,
            on_interruption,
        ),
    )
    return {}
