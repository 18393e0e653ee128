"""SageMaker-style target tracking: the paper's baseline autoscaler, as a pure policy.

MArk is compared with SageMaker hosting, which scales an endpoint variant with
Application Auto Scaling target tracking on ``SageMakerVariantInvocationsPerInstance``
(paper §5.1, refs [21], [23]). This module is that policy as AWS documents it,
so the simulator can run it as the ``sagemaker`` baseline and ``mark report``
can price the same load under it:

* The metric is invocations per instance per minute: each minute's
  invocations divided by the instances in service (SageMaker API reference,
  ``ScalingPolicyMetric.InvocationsPerInstance``: "1/numberOfInstances is sent
  as the value on each request").
* The target is ``MAX_RPS × SAFETY_FACTOR × 60`` (SageMaker developer guide,
  "Load testing your auto scaling configuration"). The paper follows AWS's
  advice to start with 100 % over-provisioning: safety factor 1/2, i.e.
  ``over_provision = 2`` (§5.1); ``config_for`` does this arithmetic.
* Application Auto Scaling's alarms: scale out when the metric is above the
  target for 3 consecutive 1-minute datapoints; scale in when it is below 90 %
  of the target for 15 consecutive datapoints ("scales out proportionally as
  fast as it can, but scales in more gradually", Application Auto Scaling user
  guide, target tracking). The new capacity is
  ``ceil(current × metric / target)``, bounded by min/max capacity.
* Cooldowns default to 300 s each, the Application Auto Scaling default for
  SageMaker endpoint variants (API reference,
  ``TargetTrackingScalingPolicyConfiguration.ScaleOutCooldown`` /
  ``ScaleInCooldown``). During a scale-out cooldown the capacity already
  added counts as part of the next scale-out, so only a *larger* scale-out
  goes out (here: ``ceil(invocations / target)`` above the current desired
  capacity); scale-in waits for both cooldowns; a scale-out ends a scale-in
  cooldown at once.
* ``min_capacity`` defaults to 1: target tracking cannot scale an endpoint
  out from zero instances (SageMaker guide, "Auto scaling policy overview").

Simplification, stated: cooldowns run from the decision, not from when
SageMaker reports the update complete (instances in service), so this is a
little quicker to act again than AWS.

Pure: ``target_tracking_step(cfg, state, *, now_s, invocations_last_minute,
in_service) -> (desired, new state)``; no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

DEFAULT_COOLDOWN_S = 300.0
SCALE_IN_FRACTION = 0.9


@dataclass(frozen=True)
class TargetTrackingConfig:
    target_invocations_per_instance: float
    """Target of ``SageMakerVariantInvocationsPerInstance``: invocations per instance per minute."""
    scale_out_cooldown_s: float = DEFAULT_COOLDOWN_S
    scale_in_cooldown_s: float = DEFAULT_COOLDOWN_S
    min_capacity: int = 1
    max_capacity: int | None = None
    datapoints_out: int = 3
    datapoints_in: int = 15
    scale_in_fraction: float = SCALE_IN_FRACTION

    def __post_init__(self) -> None:
        if not self.target_invocations_per_instance > 0:
            raise ValueError(f"target must be positive, got {self.target_invocations_per_instance}")
        if self.min_capacity < 0 or (
            self.max_capacity is not None and self.max_capacity < self.min_capacity
        ):
            raise ValueError(f"need 0 <= min <= max, got {self.min_capacity}..{self.max_capacity}")
        if self.datapoints_out < 1 or self.datapoints_in < 1:
            raise ValueError("datapoints to alarm must be at least 1")

    def clamp(self, n: int) -> int:
        n = max(self.min_capacity, n)
        return n if self.max_capacity is None else min(self.max_capacity, n)


@dataclass(frozen=True)
class TargetTrackingState:
    desired: int
    """The variant's desired instance count, booting instances included."""
    datapoints: tuple[float, ...] = ()
    """Recent metric values (invocations per instance per minute), oldest first."""
    last_scale_out_s: float = -math.inf
    last_scale_in_s: float = -math.inf


def target_tracking_step(
    cfg: TargetTrackingConfig,
    state: TargetTrackingState,
    *,
    now_s: float,
    invocations_last_minute: float,
    in_service: int,
) -> tuple[int, TargetTrackingState]:
    """Feed one 1-minute datapoint (the minute ending at ``now_s``); returns the desired count."""
    if invocations_last_minute < 0 or in_service < 0:
        raise ValueError("invocations and in-service instances must be non-negative")
    target = cfg.target_invocations_per_instance
    metric = invocations_last_minute / max(in_service, 1)
    keep = max(cfg.datapoints_out, cfg.datapoints_in)
    points = (*state.datapoints, metric)[-keep:]
    current = cfg.clamp(state.desired)
    out_cooling = now_s - state.last_scale_out_s < cfg.scale_out_cooldown_s
    in_cooling = now_s - state.last_scale_in_s < cfg.scale_in_cooldown_s
    high = len(points) >= cfg.datapoints_out and all(
        p > target for p in points[-cfg.datapoints_out :]
    )
    low = len(points) >= cfg.datapoints_in and all(
        p < cfg.scale_in_fraction * target for p in points[-cfg.datapoints_in :]
    )
    if high:
        # In a scale-out cooldown the capacity already added counts: size from the
        # load alone, and act only if that is larger than what is already coming.
        load = invocations_last_minute if out_cooling else current * metric
        want = cfg.clamp(math.ceil(load / target - 1e-9))
        if want > current:
            return want, TargetTrackingState(want, points, now_s, -math.inf)
    elif low and not out_cooling and not in_cooling:
        # Remove only the surplus: what is left keeps the latest metric at the target.
        want = cfg.clamp(math.ceil(current * metric / target - 1e-9))
        if want < current:
            return want, TargetTrackingState(want, points, state.last_scale_out_s, now_s)
    return current, TargetTrackingState(
        current, points, state.last_scale_out_s, state.last_scale_in_s
    )


def config_for(
    capacity_rps: float,
    over_provision: float = 2.0,
    *,
    scale_out_cooldown_s: float = DEFAULT_COOLDOWN_S,
    scale_in_cooldown_s: float = DEFAULT_COOLDOWN_S,
    min_capacity: int = 1,
    max_capacity: int | None = None,
) -> TargetTrackingConfig:
    """The paper's baseline for an instance that sustains ``capacity_rps``: target =
    capacity × 60 / over_provision invocations per instance per minute (AWS's
    ``MAX_RPS × SAFETY_FACTOR × 60`` with safety factor 1 / over_provision)."""
    if not capacity_rps > 0 or not over_provision >= 1:
        raise ValueError(
            f"need capacity > 0 and over-provision >= 1, got {capacity_rps}, {over_provision}"
        )
    return TargetTrackingConfig(
        target_invocations_per_instance=capacity_rps * 60.0 / over_provision,
        scale_out_cooldown_s=scale_out_cooldown_s,
        scale_in_cooldown_s=scale_in_cooldown_s,
        min_capacity=min_capacity,
        max_capacity=max_capacity,
    )


@dataclass(frozen=True)
class TrackedFleet:
    """What a replay of the policy over a per-minute series bought."""

    in_service: list[int]
    """Instances serving during each minute (launched ones after ``boot_s``)."""
    provisioned: list[int]
    """Instances paid for during each minute (booting ones included)."""
    runs: list[tuple[float, float]] = field(default_factory=list)
    """(launch, end) of every instance in seconds from the series' start; the last
    ones end at the end of the series."""


def simulate(
    per_minute_invocations: Sequence[float],
    cfg: TargetTrackingConfig,
    boot_s: float,
    initial: int,
) -> TrackedFleet:
    """Replay the policy minute by minute: ``initial`` instances serve from t=0, a
    launch serves ``boot_s`` after the decision, a scale-in removes the newest
    instances (booting ones first) at once."""
    if boot_s < 0:
        raise ValueError(f"boot time must be non-negative, got {boot_s}")
    live: list[tuple[float, float]] = [(0.0, 0.0)] * cfg.clamp(initial)  # (launched, ready)
    runs: list[tuple[float, float]] = []
    state = TargetTrackingState(desired=len(live))
    in_service: list[int] = []
    provisioned: list[int] = []
    n = len(per_minute_invocations)
    for k, invocations in enumerate(per_minute_invocations):
        start = 60.0 * k
        serving = sum(1 for _, ready in live if ready <= start)
        in_service.append(serving)
        provisioned.append(len(live))
        if k == n - 1:
            break
        now = start + 60.0
        desired, state = target_tracking_step(
            cfg, state, now_s=now, invocations_last_minute=invocations, in_service=serving
        )
        if desired > len(live):
            live += [(now, now + boot_s)] * (desired - len(live))
        while desired < len(live):
            launched, _ = live.pop()  # newest last: booting ones go first
            runs.append((launched, now))
    end = 60.0 * n
    runs += [(launched, end) for launched, _ in live]
    return TrackedFleet(in_service, provisioned, sorted(runs))


def simulate_capacity(
    per_minute_invocations: Sequence[float],
    cfg: TargetTrackingConfig,
    boot_s: float,
    initial: int,
) -> list[int]:
    """In-service instances per minute under target tracking (for offline counterfactuals)."""
    return simulate(per_minute_invocations, cfg, boot_s, initial).in_service
