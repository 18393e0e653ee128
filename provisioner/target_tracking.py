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
  ``over_provision = 2`` (§5.1); ``config_for`` does this arithmetic. ``MAX_RPS`` is
  what an instance carries within the SLO where the endpoint's load balancer pools
  the instances, as mark's planner rates them and the simulator serves them
  (``pooled_max_rps``): a user load-tests the endpoint at the size it runs at.
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

SageMaker as it behaves (``sagemaker_config_for``; off in ``config_for``, the
kinder EC2 version):

* **Cooldowns run from completion.** A cooldown is "the amount of time, in
  seconds, after a scale-out [scale-in] activity completes before another
  [...] activity can start" (Application Auto Scaling API reference,
  ``TargetTrackingScalingPolicyConfiguration``). A SageMaker scaling activity
  completes when the endpoint update does: the new instances are InService.
  The caller says when that was (``update_done_s``); the step never reads a clock.
* **No re-scaling while the endpoint updates.** Application Auto Scaling sets
  the variant's desired count through SageMaker's UpdateEndpointWeightsAndCapacities:
  "When it receives the request, SageMaker sets the endpoint status to Updating.
  After updating the endpoint, it sets the status to InService" (SageMaker API
  reference). An endpoint that is updating takes no other update, so no scaling
  activity starts until it is InService again. The caller says whether an
  update is in progress (``updating``).
* **The alarm sees a minute late.** SageMaker publishes invocation metrics at a
  1-minute frequency (SageMaker developer guide, "Amazon SageMaker AI metrics in
  Amazon CloudWatch": "Metrics are available at a 1-minute frequency"; API
  reference ``MetricsConfig``: invocation metrics are published at the default
  60-second interval), and CloudWatch evaluates an alarm with a 1-minute period
  once a minute. So the datapoint of the minute ending at ``m`` reaches the
  alarm at the first evaluation after it is published, ``m + 60 s``:
  ``DEFAULT_METRIC_DELAY_S = 60``. AWS documents no exact publication latency;
  60 s is the least this chain allows (more only delays the reaction further).
  On top of it the alarm still needs its 3 (15) datapoints. The delay takes
  effect at the first step at or after a datapoint becomes visible (the alarm
  is evaluated once a minute).

Scale-in is taken to complete at once (SageMaker's drain time is not modelled).

Pure: ``target_tracking_step(cfg, state, *, now_s, invocations_last_minute,
in_service, updating, update_done_s) -> (desired, new state)``; no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from provisioner.greedy import PlannerOption
from provisioner.pooling import capacity_in_pool

DEFAULT_COOLDOWN_S = 300.0
SCALE_IN_FRACTION = 0.9
DEFAULT_METRIC_DELAY_S = 60.0
"""A minute's datapoint reaches the alarm 60 s after the minute ends (module docstring)."""

Activity = Literal["out", "in"]


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
    metric_delay_s: float = 0.0
    """From the end of a minute to when its datapoint reaches the alarm."""
    cooldown_from_completion: bool = False
    """A cooldown runs from when the scaling activity completes (SageMaker), not the decision."""
    block_while_updating: bool = False
    """No scaling activity starts while the endpoint is updating (SageMaker)."""

    def __post_init__(self) -> None:
        if not self.target_invocations_per_instance > 0:
            raise ValueError(f"target must be positive, got {self.target_invocations_per_instance}")
        if self.min_capacity < 0 or (
            self.max_capacity is not None and self.max_capacity < self.min_capacity
        ):
            raise ValueError(f"need 0 <= min <= max, got {self.min_capacity}..{self.max_capacity}")
        if self.datapoints_out < 1 or self.datapoints_in < 1:
            raise ValueError("datapoints to alarm must be at least 1")
        if not self.metric_delay_s >= 0:
            raise ValueError(f"metric delay must be non-negative, got {self.metric_delay_s}")

    def clamp(self, n: int) -> int:
        n = max(self.min_capacity, n)
        return n if self.max_capacity is None else min(self.max_capacity, n)


@dataclass(frozen=True)
class TargetTrackingState:
    desired: int
    """The variant's desired instance count, booting instances included."""
    datapoints: tuple[float, ...] = ()
    """Metric values the alarm has seen (invocations per instance per minute), oldest first."""
    last_scale_out_s: float = -math.inf
    """When the scale-out cooldown began (the decision, or the activity's completion)."""
    last_scale_in_s: float = -math.inf
    pending: tuple[tuple[float, float, float], ...] = ()
    """Datapoints not yet visible to the alarm: (visible at, metric, invocations)."""
    latest_invocations: float = 0.0
    """The invocations of the newest datapoint the alarm has seen."""
    activity: Activity | None = None
    """A scaling activity started and not yet seen complete (cooldown from completion)."""


def _see(
    cfg: TargetTrackingConfig, state: TargetTrackingState, now_s: float, metric: float, inv: float
) -> TargetTrackingState:
    """Add the newest datapoint; move those visible by ``now_s`` to what the alarm sees."""
    pending = (*state.pending, (now_s + cfg.metric_delay_s, metric, inv))
    seen = [p for p in pending if p[0] <= now_s + 1e-9]
    if not seen:
        return replace(state, pending=pending)
    keep = max(cfg.datapoints_out, cfg.datapoints_in)
    return replace(
        state,
        datapoints=(*state.datapoints, *(m for _, m, _ in seen))[-keep:],
        pending=tuple(p for p in pending if p[0] > now_s + 1e-9),
        latest_invocations=seen[-1][2],
    )


def _complete(
    state: TargetTrackingState,
    now_s: float,
    updating: bool,
    update_done_s: float | None,
) -> TargetTrackingState:
    """Close a scaling activity the endpoint has finished; its cooldown starts then."""
    if state.activity is None or updating:
        return state
    done = now_s if update_done_s is None else min(update_done_s, now_s)
    if state.activity == "out":
        return replace(state, activity=None, last_scale_out_s=done)
    return replace(state, activity=None, last_scale_in_s=done)


def target_tracking_step(
    cfg: TargetTrackingConfig,
    state: TargetTrackingState,
    *,
    now_s: float,
    invocations_last_minute: float,
    in_service: int,
    updating: bool = False,
    update_done_s: float | None = None,
) -> tuple[int, TargetTrackingState]:
    """Feed one 1-minute datapoint (the minute ending at ``now_s``); returns the desired count.

    ``updating``: the endpoint is updating now (instances of the last scaling
    activity not yet in service); ``update_done_s``: when it last finished one
    (default ``now_s``). Both matter only with ``cooldown_from_completion`` or
    ``block_while_updating``.
    """
    if invocations_last_minute < 0 or in_service < 0:
        raise ValueError("invocations and in-service instances must be non-negative")
    target = cfg.target_invocations_per_instance
    state = _see(
        cfg, state, now_s, invocations_last_minute / max(in_service, 1), invocations_last_minute
    )
    if cfg.cooldown_from_completion:
        state = _complete(state, now_s, updating, update_done_s)
    current = cfg.clamp(state.desired)
    state = replace(state, desired=current)
    if updating and cfg.block_while_updating:
        return current, state
    points = state.datapoints
    metric = points[-1] if points else 0.0
    out_cooling = state.activity == "out" or (
        now_s - state.last_scale_out_s < cfg.scale_out_cooldown_s
    )
    in_cooling = state.activity == "in" or now_s - state.last_scale_in_s < cfg.scale_in_cooldown_s
    high = len(points) >= cfg.datapoints_out and all(
        p > target for p in points[-cfg.datapoints_out :]
    )
    low = len(points) >= cfg.datapoints_in and all(
        p < cfg.scale_in_fraction * target for p in points[-cfg.datapoints_in :]
    )
    from_completion = cfg.cooldown_from_completion
    if high:
        # In a scale-out cooldown the capacity already added counts: size from the
        # load alone, and act only if that is larger than what is already coming.
        load = state.latest_invocations if out_cooling else current * metric
        want = cfg.clamp(math.ceil(load / target - 1e-9))
        if want > current:
            # A scale-out ends a scale-in cooldown at once.
            return want, replace(
                state,
                desired=want,
                last_scale_out_s=state.last_scale_out_s if from_completion else now_s,
                last_scale_in_s=-math.inf,
                activity="out" if from_completion else None,
            )
    elif low and not out_cooling and not in_cooling:
        # Remove only the surplus: what is left keeps the latest metric at the target.
        want = cfg.clamp(math.ceil(current * metric / target - 1e-9))
        if want < current:
            return want, replace(
                state,
                desired=want,
                last_scale_in_s=state.last_scale_in_s if from_completion else now_s,
                activity="in" if from_completion else None,
            )
    return current, state


def pooled_max_rps(
    option: PlannerOption, load_rps: float, over_provision: float, *, max_size: int = 10_000
) -> float:
    """``MAX_RPS`` for the target: the per-instance capacity within the SLO in the pool
    the fleet runs at ``load_rps`` over-provisioned by ``over_provision``: the least size
    ``n`` whose ``n × capacity_in_pool(option, n)`` carries it (``max_size`` at most). That
    product rises with ``n`` (the per-instance capacity never falls), so bisection finds it."""
    need = over_provision * load_rps

    def carries(n: int) -> bool:
        return n * capacity_in_pool(option, n) >= need - 1e-9

    lo, hi = 1, max_size
    if not carries(hi):
        return capacity_in_pool(option, hi)
    while lo < hi:
        mid = (lo + hi) // 2
        if carries(mid):
            hi = mid
        else:
            lo = mid + 1
    return capacity_in_pool(option, lo)


def config_for(
    capacity_rps: float,
    over_provision: float = 2.0,
    *,
    scale_out_cooldown_s: float = DEFAULT_COOLDOWN_S,
    scale_in_cooldown_s: float = DEFAULT_COOLDOWN_S,
    min_capacity: int = 1,
    max_capacity: int | None = None,
    metric_delay_s: float = 0.0,
    cooldown_from_completion: bool = False,
    block_while_updating: bool = False,
) -> TargetTrackingConfig:
    """The paper's baseline for an instance that sustains ``capacity_rps``: target =
    capacity × 60 / over_provision invocations per instance per minute (AWS's
    ``MAX_RPS × SAFETY_FACTOR × 60`` with safety factor 1 / over_provision). By
    default the kinder version: no metric delay, cooldowns from the decision."""
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
        metric_delay_s=metric_delay_s,
        cooldown_from_completion=cooldown_from_completion,
        block_while_updating=block_while_updating,
    )


def sagemaker_config_for(
    capacity_rps: float,
    over_provision: float = 2.0,
    *,
    metric_delay_s: float = DEFAULT_METRIC_DELAY_S,
    max_capacity: int | None = None,
) -> TargetTrackingConfig:
    """``config_for`` as SageMaker behaves: the metric reaches the alarm ``metric_delay_s``
    after its minute, cooldowns run from completion, no re-scaling while updating."""
    return config_for(
        capacity_rps,
        over_provision,
        max_capacity=max_capacity,
        metric_delay_s=metric_delay_s,
        cooldown_from_completion=True,
        block_while_updating=True,
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
    done_at = 0.0  # when the endpoint last finished an update
    n = len(per_minute_invocations)
    for k, invocations in enumerate(per_minute_invocations):
        start = 60.0 * k
        serving = sum(1 for _, ready in live if ready <= start)
        in_service.append(serving)
        provisioned.append(len(live))
        if k == n - 1:
            break
        now = start + 60.0
        updating = any(ready > now for _, ready in live)
        desired, state = target_tracking_step(
            cfg,
            state,
            now_s=now,
            invocations_last_minute=invocations,
            in_service=serving,
            updating=updating,
            update_done_s=None if updating else done_at,
        )
        if desired > len(live):
            live += [(now, now + boot_s)] * (desired - len(live))
            done_at = now + boot_s
        elif desired < len(live):
            done_at = now  # scale-in completes at once
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
