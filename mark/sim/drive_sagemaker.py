"""The ``sagemaker`` baseline in the simulator: target tracking on one instance type.

Every minute the policy (``provisioner.target_tracking``, the same function
``mark report`` prices its counterfactual with) sees the last minute's
invocations per instance in service and sets the desired count; launches take
the EC2 boot time, surplus instances go at once (newest first, booting ones
before serving ones). Instances queue whatever they are sent: SageMaker has no
admission control and no spill. Priced at the EC2 on-demand rate of the type,
which understates SageMaker (ml.* instances cost more), in its favour.
"""

from __future__ import annotations

import math

import numpy as np

from mark.catalog import Market
from mark.errors import ConfigError
from mark.ports import InstanceState, LaunchRequest
from mark.sim.loop import PolicyEvents, run_loop
from mark.sim.world import Extra, SimWorld
from provisioner.greedy import PlannerOption
from provisioner.target_tracking import TargetTrackingState, config_for, target_tracking_step

STEP_S = 60.0  # target tracking looks at the last minute, every minute


def baseline_option(world: SimWorld) -> PlannerOption:
    """The user's type, or the on-demand type with the lowest price per request served."""
    od = [o for o in world.options if o.market == Market.ON_DEMAND.value]
    if world.cfg.sagemaker_type is not None:
        chosen = [o for o in od if o.instance_type == world.cfg.sagemaker_type]
        if not chosen:
            raise ConfigError(
                f"SageMaker type {world.cfg.sagemaker_type!r} cannot serve {world.model.name} "
                f"within RT_max; usable: {', '.join(o.instance_type for o in od)}"
            )
        return chosen[0]
    return min(od, key=lambda o: (o.price_per_hour / o.capacity_rps, o.instance_type))


async def drive_sagemaker(world: SimWorld) -> Extra:
    """Run target tracking on ``world``, starting from what the first minute's load needs."""
    opt = baseline_option(world)
    cfg = config_for(
        opt.capacity_rps, world.cfg.over_provision, max_capacity=world.cfg.max_instances
    )
    first_minute = world.true_load(STEP_S)[:1] or [0.0]
    initial = cfg.clamp(math.ceil(first_minute[0] * 60.0 / cfg.target_invocations_per_instance))
    state = TargetTrackingState(initial)
    model = world.model.name
    order: list[str] = []  # launch order, oldest first

    async def launch(n: int) -> None:
        got = await world.fleet.launch(LaunchRequest(model, opt.instance_type, Market.ON_DEMAND, n))
        order.extend(i.instance_id for i in got)

    await launch(initial)

    async def on_step(t: float) -> None:
        nonlocal state
        live = {i.instance_id: i for i in await world.fleet.list()}
        in_service = sum(1 for i in live.values() if i.state is InstanceState.RUNNING)
        lo, hi = np.searchsorted(world.arrivals, [t - STEP_S, t])
        desired, state = target_tracking_step(
            cfg, state, now_s=t, invocations_last_minute=float(hi - lo), in_service=in_service
        )
        order[:] = [iid for iid in order if iid in live]
        if desired > len(order):
            await launch(desired - len(order))
        elif desired < len(order):
            booting = [iid for iid in order if live[iid].state is InstanceState.PENDING]
            serving = [iid for iid in order if iid not in set(booting)]
            surplus = len(order) - desired
            gone = (booting[::-1] + serving[::-1])[:surplus]
            await world.fleet.terminate(gone)
            order[:] = [iid for iid in order if iid not in set(gone)]

    await run_loop(world, PolicyEvents(STEP_S, on_step))
    return {"sagemaker_type": opt.instance_type}
