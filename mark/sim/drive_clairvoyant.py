"""The ``clairvoyant`` policies in the simulator: an instance-only clairvoyant schedule.

The MILP (``provisioner.milp.solve_min_cost``) sees the true future load, the
per-minute peak of the arrivals themselves, and returns the cheapest count of
each option per minute that covers it; the driver then holds exactly those
counts, launching and terminating at each minute. Its world boots instances
at once (``FLEET_BOOT_S``).

It is a schedule, not a lower bound: it covers each minute's peak 5-second
rate with the planner's per-instance capacities, uses no Lambda and no miss
budget, and stops at a time limit. A policy can cost less. The lower bound
on every policy's cost is ``mark.sim.bound``. (``optimal``/``optimal-spot``
are accepted aliases of these policies' names.)
"""

from __future__ import annotations

import numpy as np

from mark.catalog import Market
from mark.ports import LaunchRequest
from mark.sim.loop import PolicyEvents, run_loop
from mark.sim.world import Extra, SimWorld
from provisioner.milp import solve_min_cost

FLEET_BOOT_S = 0.0  # launch → serving in the clairvoyant policy's world
STEP_S = 60.0


async def drive_clairvoyant(world: SimWorld) -> Extra:
    """Solve the MILP on the world's true load and follow its schedule minute by minute."""
    plan = solve_min_cost(
        world.true_load(STEP_S),
        world.options,
        slo_s=world.model.rt_max_s,
        time_limit_s=world.cfg.milp_time_limit_s,
    )
    held: dict[tuple[str, str], list[str]] = {o.key: [] for o in plan.options}
    step_i = 0

    async def on_step(t: float) -> None:
        nonlocal step_i
        if step_i >= plan.counts.shape[1]:
            return
        for oi, opt in enumerate(plan.options):
            want = int(np.rint(plan.counts[oi, step_i]))
            have = held[opt.key]
            if want > len(have):
                got = await world.fleet.launch(
                    LaunchRequest(
                        world.model.name, opt.instance_type, Market(opt.market), want - len(have)
                    )
                )
                have.extend(i.instance_id for i in got)
            elif want < len(have):
                gone = have[want:]
                del have[want:]
                await world.fleet.terminate(gone)
        step_i += 1

    await run_loop(world, PolicyEvents(STEP_S, on_step))
    return {
        "milp_ec2_cost": plan.cost,
        "milp_lower_bound": plan.lower_bound,
        "milp_optimal": plan.optimal,
    }
