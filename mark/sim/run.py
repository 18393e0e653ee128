"""Simulate one policy on one workload: virtual time, the real decision code, a priced result.

``Simulation`` builds the simulated world (``mark.sim.world``) and hands it to
the driver of the policy's kind:

- ``mark`` — the daemon's ``Controller`` (``mark.sim.drive_mark``);
- ``clairvoyant`` — the instance-only clairvoyant MILP schedule
  (``mark.sim.drive_clairvoyant``);
- ``sagemaker`` — target tracking on one type (``mark.sim.drive_sagemaker``),
  as SageMaker (``sagemaker``) or on EC2 (``ec2-target-tracking``).

Each driver advances the world with ``mark.sim.loop.run_loop``; the world
prices what the fleet and Lambda did in the measured window.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from mark.catalog import Catalog
from mark.ports import Store
from mark.sim.drive_clairvoyant import FLEET_BOOT_S, drive_clairvoyant
from mark.sim.drive_mark import drive_mark
from mark.sim.drive_sagemaker import drive_sagemaker
from mark.sim.models import SimModel
from mark.sim.policies import Policy
from mark.sim.results import PolicyResult
from mark.sim.workloads import Workload
from mark.sim.world import Progress, SimConfig, SimWorld
from predictor.base import Forecaster

__all__ = ["Progress", "SimConfig", "Simulation"]


def fleet_boot_s(policy: Policy, cfg: SimConfig) -> float | None:
    """Launch → serving in the policy's world (None: ``cfg.boot_s``)."""
    if policy.kind == "clairvoyant":
        return FLEET_BOOT_S
    if policy.hosting == "sagemaker":
        return cfg.sagemaker_boot_s
    return None


class Simulation:
    """One policy on one workload; ``forecaster`` is what the ``mark`` policies predict with."""

    def __init__(
        self,
        workload: Workload,
        model: SimModel,
        policy: Policy,
        cfg: SimConfig,
        *,
        arrivals: NDArray[np.float64],
        forecaster: Forecaster | None = None,
        catalog: Catalog | None = None,
        progress: Progress | None = None,
        store: Store | None = None,
    ) -> None:
        self.policy = policy
        self.forecaster = forecaster
        self.world = SimWorld(
            workload,
            model,
            policy,
            cfg,
            arrivals=arrivals,
            catalog=catalog,
            progress=progress,
            store=store,
            fleet_boot_s=fleet_boot_s(policy, cfg),
        )

    @property
    def store(self) -> Store:
        return self.world.store

    async def run(self) -> PolicyResult:
        if self.policy.kind == "mark":
            extra = await drive_mark(self.world, self.forecaster)
        elif self.policy.kind == "clairvoyant":
            extra = await drive_clairvoyant(self.world)
        else:
            extra = await drive_sagemaker(self.world)
        return self.world.result(extra)
