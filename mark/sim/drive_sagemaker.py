"""The target-tracking baselines in the simulator: ``sagemaker`` and ``ec2-target-tracking``.

Every minute the policy (``provisioner.target_tracking``, the same function
``mark report`` prices its counterfactual with) is fed the last minute's
invocations and the instances in service, and sets the desired count;
launches take the world's boot time, surplus instances go at once (newest
first, booting ones before serving ones). Instances queue whatever they are
sent: SageMaker has no admission control and no spill.

The two policies differ in the world they run in:

- ``sagemaker`` — SageMaker as its users pay it. The type is one SageMaker
  hosting offers with an ml.* price (``mark.catalog.hosting``; families AWS is
  retiring, P2 and P3, only when named with ``--sagemaker-type``), the one with
  the lowest ml.* price per request at the capacity the planner rates it with;
  the world prices its instances at that ml.* price. The alarm sees a minute's
  invocations ``SimConfig.sagemaker_metric_delay_s`` (default 60 s) after the
  minute, cooldowns run from when the new instances are in service, nothing
  re-scales while the endpoint is updating, a response later than
  ``sagemaker_invocation_timeout_s`` (60 s) fails, and new instances serve after
  ``sagemaker_boot_s`` (default: the EC2 boot time).
- ``ec2-target-tracking`` — the kinder world, the strong comparison: the EC2
  on-demand type with the lowest price per request (or ``--sagemaker-type``),
  at its EC2 price, no metric delay, cooldowns from the decision, no blocking,
  no timeout.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from mark.catalog import HostingPrices, Market
from mark.errors import ConfigError, UnknownOffering
from mark.ports import InstanceState, LaunchRequest
from mark.sim.loop import PolicyEvents, run_loop
from mark.sim.world import Extra, SimWorld
from provisioner.greedy import PlannerOption
from provisioner.target_tracking import (
    TargetTrackingConfig,
    TargetTrackingState,
    config_for,
    pooled_max_rps,
    sagemaker_config_for,
    target_tracking_step,
)

STEP_S = 60.0  # target tracking looks at the last minute, every minute
HISTORY_MINUTES = 1440  # the day of history the typical rate is the mean of


def hosting_option(
    options: list[PlannerOption], hosting: HostingPrices, wanted: str | None, model: str
) -> PlannerOption:
    """The SageMaker type: ``wanted`` (it must have an ml.* price), else the offered type
    with the lowest ml.* price per request served."""
    if wanted is not None:
        chosen = [o for o in options if o.instance_type == wanted]
        if not chosen:
            raise ConfigError(
                f"SageMaker type {wanted!r} cannot serve {model} within RT_max; usable: "
                f"{', '.join(o.instance_type for o in options)}"
            )
        try:
            hosting.price(wanted)
        except UnknownOffering as exc:
            raise ConfigError(f"--sagemaker-type {wanted}: {exc}") from None
        return chosen[0]
    offered = set(hosting.offered())
    priced = [o for o in options if o.instance_type in offered]
    if not priced:
        raise ConfigError(
            f"no type {model} can use has a SageMaker ml.* price (usable: "
            f"{', '.join(o.instance_type for o in options)}; priced: "
            f"{', '.join(sorted(offered))}); name one with --sagemaker-type"
        )
    return min(
        priced,
        key=lambda o: (hosting.prices[o.instance_type].price_per_hour / o.capacity_rps, o.key),
    )


def typical_rate(world: SimWorld) -> float:
    """The mean request rate of the day before the warm-up: the load a user sizes the
    target at (``pooled_max_rps``), known before the run, not the window's."""
    windows = world.history_windows(HISTORY_MINUTES)
    seconds = sum(w.window_s for w in windows)
    return sum(w.count for w in windows) / seconds if seconds > 0 else 0.0


def pooled_options(world: SimWorld) -> list[PlannerOption]:
    """The on-demand options rated as a target-tracking fleet runs them: each at its
    capacity in the pool the typical load needs at the policy's over-provisioning, the
    capacity model mark's planner plans with and the simulator serves at."""
    rate, over = typical_rate(world), world.cfg.over_provision
    return [
        replace(o, capacity_rps=pooled_max_rps(o, rate, over))
        for o in world.options
        if o.market == Market.ON_DEMAND.value
    ]


def baseline_option(world: SimWorld) -> PlannerOption:
    """The policy's type: the user's, or the one with the lowest price per request served
    (ml.* prices among SageMaker's offered types, or EC2 prices among any), each rated at
    pooled capacity (``pooled_options``)."""
    od = pooled_options(world)
    wanted = world.cfg.sagemaker_type
    if world.hosting is not None:
        return hosting_option(od, world.hosting, wanted, world.model.name)
    if wanted is not None:
        chosen = [o for o in od if o.instance_type == wanted]
        if not chosen:
            raise ConfigError(
                f"SageMaker type {wanted!r} cannot serve {world.model.name} "
                f"within RT_max; usable: {', '.join(o.instance_type for o in od)}"
            )
        return chosen[0]
    return min(od, key=lambda o: (o.price_per_hour / o.capacity_rps, o.instance_type))


def policy_config(world: SimWorld, opt: PlannerOption) -> TargetTrackingConfig:
    """Target tracking at ``opt``'s (pooled) capacity over-provisioned as configured."""
    cfg = world.cfg
    if world.hosting is not None:
        return sagemaker_config_for(
            opt.capacity_rps,
            cfg.over_provision,
            metric_delay_s=cfg.sagemaker_metric_delay_s,
            max_capacity=cfg.max_instances,
        )
    return config_for(opt.capacity_rps, cfg.over_provision, max_capacity=cfg.max_instances)


async def drive_sagemaker(world: SimWorld) -> Extra:
    """Run target tracking on ``world``, starting from what the first minute's load needs."""
    opt = baseline_option(world)
    cfg = policy_config(world, opt)
    first_minute = world.true_load(STEP_S)[:1] or [0.0]
    initial = cfg.clamp(math.ceil(first_minute[0] * 60.0 / cfg.target_invocations_per_instance))
    state = TargetTrackingState(initial)
    model = world.model.name
    order: list[str] = []  # launch order, oldest first
    done_at = world.t_begin  # when the endpoint last finished an update

    async def launch(n: int) -> float:
        """Launch ``n``; when the last of them will be in service."""
        got = await world.fleet.launch(LaunchRequest(model, opt.instance_type, Market.ON_DEMAND, n))
        order.extend(i.instance_id for i in got)
        return max((world.fleet.ready_at(i.instance_id) for i in got), default=world.clock.t)

    done_at = await launch(initial)

    async def on_step(t: float) -> None:
        nonlocal state, done_at
        live = {i.instance_id: i for i in await world.fleet.list()}
        in_service = sum(1 for i in live.values() if i.state is InstanceState.RUNNING)
        updating = any(i.state is InstanceState.PENDING for i in live.values())
        lo, hi = np.searchsorted(world.arrivals, [t - STEP_S, t])
        desired, state = target_tracking_step(
            cfg,
            state,
            now_s=t,
            invocations_last_minute=float(hi - lo),
            in_service=in_service,
            updating=updating,
            update_done_s=None if updating else done_at,
        )
        order[:] = [iid for iid in order if iid in live]
        if desired > len(order):
            done_at = await launch(desired - len(order))
        elif desired < len(order):
            booting = [iid for iid in order if live[iid].state is InstanceState.PENDING]
            serving = [iid for iid in order if iid not in set(booting)]
            surplus = len(order) - desired
            gone = (booting[::-1] + serving[::-1])[:surplus]
            await world.fleet.terminate(gone)
            order[:] = [iid for iid in order if iid not in set(gone)]
            done_at = t  # a scale-in completes at once

    await run_loop(world, PolicyEvents(STEP_S, on_step))
    extra: Extra = {
        "sagemaker_type": opt.instance_type,
        "over_provision": world.cfg.over_provision,
        "target_capacity_rps": round(opt.capacity_rps, 4),
    }
    if world.hosting is not None:
        price = world.hosting.price(opt.instance_type)
        extra.update(
            sagemaker_type=price.ml_type,
            ml_price_per_hour=price.price_per_hour,
            ml_price_source="derived" if price.derived else "cited",
            metric_delay_s=cfg.metric_delay_s,
            invocation_timeout_s=world.cfg.sagemaker_invocation_timeout_s,
        )
    return extra
