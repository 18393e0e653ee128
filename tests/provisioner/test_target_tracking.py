"""SageMaker-style target tracking, on cases small enough to check by hand.

Every case uses a target of 100 invocations per instance per minute, so the
metric is easy to read: 250 invocations on 1 instance is 250 (above target),
200 on 4 is 50 (below 90 % of target).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from provisioner.target_tracking import (
    DEFAULT_METRIC_DELAY_S,
    TargetTrackingConfig,
    TargetTrackingState,
    config_for,
    sagemaker_config_for,
    simulate,
    simulate_capacity,
    target_tracking_step,
)

CFG = TargetTrackingConfig(target_invocations_per_instance=100.0, max_capacity=10)

# (now_s, invocations, in_service, updating, update_done_s): one minute of an endpoint.
EndpointMinute = tuple[float, float, int, bool, float | None]


def feed(
    state: TargetTrackingState,
    minutes: list[tuple[float, float, int]],
    cfg: TargetTrackingConfig = CFG,
) -> list[int]:
    """Feed (now_s, invocations, in_service) datapoints; the desired count after each."""
    out = []
    for now, inv, serving in minutes:
        desired, state = target_tracking_step(
            cfg, state, now_s=now, invocations_last_minute=inv, in_service=serving
        )
        out.append(desired)
    return out


def feed_endpoint(
    cfg: TargetTrackingConfig,
    minutes: list[EndpointMinute],
    state: TargetTrackingState | None = None,
) -> list[int]:
    """Feed (now_s, invocations, in_service, updating, update_done_s); desired after each."""
    state = state or TargetTrackingState(desired=1)
    out = []
    for now, inv, serving, updating, done in minutes:
        desired, state = target_tracking_step(
            cfg,
            state,
            now_s=now,
            invocations_last_minute=inv,
            in_service=serving,
            updating=updating,
            update_done_s=done,
        )
        out.append(desired)
    return out


def test_load_at_or_just_under_the_target_changes_nothing() -> None:
    at_target = [(60.0 * k, 100.0, 1) for k in range(1, 31)]
    assert feed(TargetTrackingState(desired=1), at_target) == [1] * 30
    just_under = [(60.0 * k, 95.0, 1) for k in range(1, 31)]  # 95 is not below 90
    assert feed(TargetTrackingState(desired=1), just_under) == [1] * 30


def test_step_up_scales_out_after_three_datapoints_and_again_only_after_the_cooldown() -> None:
    # 250/min on 1 instance: metric 250 > 100 for the 3rd time at t=180 ->
    # ceil(1 * 250 / 100) = 3. The 2 new instances boot slowly (still not in
    # service), so the metric stays 250; inside the 300 s scale-out cooldown the
    # capacity already added counts (ceil(250 / 100) = 3, not larger): no change.
    # At t=480 the cooldown is over: ceil(3 * 250 / 100) = 8, AWS's overshoot
    # when instances boot slower than the cooldown.
    minutes = [(60.0 * k, 250.0, 1) for k in range(1, 9)]
    assert feed(TargetTrackingState(desired=1), minutes) == [1, 1, 3, 3, 3, 3, 3, 8]


def test_a_larger_surge_inside_the_scale_out_cooldown_scales_out_at_once() -> None:
    # Documented: during the cooldown only a *larger* scale-out goes out.
    minutes = [(60.0, 250.0, 1), (120.0, 250.0, 1), (180.0, 250.0, 1), (240.0, 450.0, 1)]
    assert feed(TargetTrackingState(desired=1), minutes) == [1, 1, 3, 5]


def test_scale_in_after_fifteen_datapoints_below_ninety_percent_removes_only_the_surplus() -> None:
    # 200/min on 4 instances: metric 50 < 90 from t=60 on; the 15th such datapoint
    # (t=900) scales in to ceil(4 * 50 / 100) = 2, which keeps the metric at 100.
    minutes = [(60.0 * k, 200.0, 4) for k in range(1, 16)]
    assert feed(TargetTrackingState(desired=4), minutes) == [4] * 14 + [2]
    # 89/min on 1 instance is below 90 % but min_capacity 1 holds.
    low = [(60.0 * k, 89.0, 1) for k in range(1, 31)]
    assert feed(TargetTrackingState(desired=1), low) == [1] * 30


def test_scale_in_waits_for_both_cooldowns_scale_out_does_not_wait_for_scale_in() -> None:
    low_history = (50.0,) * 15
    after_out = TargetTrackingState(desired=4, datapoints=low_history, last_scale_out_s=700.0)
    assert feed(after_out, [(900.0, 200.0, 4)]) == [4]  # 200 s after a scale-out
    assert feed(after_out, [(1000.0, 200.0, 4)]) == [2]  # 300 s after: allowed
    after_in = TargetTrackingState(desired=4, datapoints=low_history, last_scale_in_s=700.0)
    assert feed(after_in, [(900.0, 200.0, 4)]) == [4]
    high_history = (250.0, 250.0)
    surge = TargetTrackingState(desired=2, datapoints=high_history, last_scale_in_s=880.0)
    assert feed(surge, [(900.0, 500.0, 2)]) == [5]  # ceil(2 * 250 / 100), at once


def test_min_and_max_capacity_bound_the_decision() -> None:
    huge = [(60.0 * k, 10_000.0, 1) for k in range(1, 4)]
    assert feed(TargetTrackingState(desired=1), huge) == [1, 1, 10]  # not ceil(100)
    cfg = TargetTrackingConfig(100.0, min_capacity=2, max_capacity=3)
    idle = [(60.0 * k, 0.0, 3) for k in range(1, 16)]
    assert feed(TargetTrackingState(desired=3), idle, cfg) == [3] * 14 + [2]
    assert feed(TargetTrackingState(desired=7), [(60.0, 100.0, 7)], cfg) == [3]  # clamped


def test_config_for_turns_a_sustained_rate_into_the_per_minute_target() -> None:
    cfg = config_for(10.0)  # 10 r/s × 60 / 2 = 300 per instance per minute
    assert cfg.target_invocations_per_instance == 300.0
    assert (cfg.scale_out_cooldown_s, cfg.scale_in_cooldown_s) == (300.0, 300.0)
    assert (cfg.datapoints_out, cfg.datapoints_in, cfg.min_capacity) == (3, 15, 1)
    assert config_for(10.0, 1.0).target_invocations_per_instance == 600.0
    with pytest.raises(ValueError):
        config_for(0.0)
    with pytest.raises(ValueError):
        config_for(10.0, 0.5)


def test_simulate_capacity_counts_boot_time_before_new_instances_serve() -> None:
    # 100/min for 2 minutes, then 250/min. Datapoints of minutes 2, 3, 4 are above
    # target: at t=300 desired becomes 3; the 2 launches boot 90 s and serve from
    # t=390, i.e. from minute 7 (starting t=420). Then 250 / 3 = 83: no change.
    series = [100.0] * 2 + [250.0] * 10
    got = simulate(series, CFG, boot_s=90.0, initial=1)
    assert got.in_service == [1] * 7 + [3] * 5
    assert got.provisioned == [1] * 5 + [3] * 7
    assert got.runs == [(0.0, 720.0), (300.0, 720.0), (300.0, 720.0)]
    assert simulate_capacity(series, CFG, 90.0, 1) == got.in_service


def test_simulate_scale_in_ends_the_newest_runs() -> None:
    series = [200.0] * 20  # 4 instances at 50 each: scale in to 2 at t=900
    got = simulate(series, CFG, boot_s=0.0, initial=4)
    assert got.in_service == [4] * 15 + [2] * 5
    assert sorted(e for _, e in got.runs) == [900.0, 900.0, 1200.0, 1200.0]
    billed_minutes = sum(e - s for s, e in got.runs) / 60.0
    assert math.isclose(billed_minutes, sum(got.provisioned))


# -- SageMaker as it behaves: cooldowns from completion, no re-scaling while updating,
# -- the metric seen late.

SM = TargetTrackingConfig(
    100.0,
    max_capacity=10,
    datapoints_in=2,
    cooldown_from_completion=True,
    block_while_updating=True,
)


def test_the_scale_in_cooldown_after_a_scale_out_runs_from_when_its_instances_are_in_service() -> (
    None
):
    # 250/min on 1: 3rd high datapoint at t=180 -> 3. The 2 new instances take 150 s:
    # the endpoint updates until t=330, so at 240 and 300 nothing changes (the load has
    # dropped; 2 low datapoints would scale in). From t=360 the load (60/min on 3 = 20) is
    # low, but the scale-out's cooldown runs 330 -> 630: the first scale-in is at t=660,
    # to ceil(3 * 20 / 100) = 1. Counted from the decision (180 -> 480) it would be t=480.
    minutes: list[EndpointMinute] = [(60.0 * k, 250.0, 1, False, None) for k in (1, 2, 3)]
    minutes += [(240.0, 50.0, 1, True, None), (300.0, 50.0, 1, True, None)]
    minutes += [(60.0 * k, 60.0, 3, False, 330.0) for k in range(6, 12)]
    assert feed_endpoint(SM, minutes) == [1, 1, 3, 3, 3, 3, 3, 3, 3, 3, 1]
    from_decision = TargetTrackingConfig(100.0, max_capacity=10, datapoints_in=2)
    assert feed_endpoint(from_decision, minutes) == [1, 1, 3, 3, 3, 3, 3, 1, 1, 1, 1]


def test_the_scale_out_cooldown_runs_from_completion_so_slow_boots_do_not_overshoot() -> None:
    # The case of test_step_up_...: 250/min on 1, scale-out to 3 at t=180, but the new
    # instances take 400 s (in service at 580). Counted from the decision, the cooldown
    # ends at 480 while they still boot, and the metric (250 on 1) scales out to
    # ceil(3 * 250 / 100) = 8. Counted from completion, the activity is still in progress
    # at 480 and 540: only a larger scale-out than the load alone needs could go
    # (ceil(250 / 100) = 3: none). (No update block here, to isolate the cooldown.)
    from_completion = replace(SM, block_while_updating=False, datapoints_in=15)
    minutes: list[EndpointMinute] = [(60.0 * k, 250.0, 1, k > 3, None) for k in range(1, 10)]
    assert feed_endpoint(from_completion, minutes) == [1, 1, 3, 3, 3, 3, 3, 3, 3]
    from_decision = TargetTrackingConfig(100.0, max_capacity=10)
    assert feed_endpoint(from_decision, minutes) == [1, 1, 3, 3, 3, 3, 3, 8, 8]
    # In service at 580: its cooldown runs 580 -> 880. At t=600, 450/min on 3 = 150 is
    # high (with 250, 250 before it): inside the cooldown a larger scale-out still goes,
    # sized by the load alone: ceil(450 / 100) = 5.
    done: list[EndpointMinute] = [(600.0, 450.0, 3, False, 580.0)]
    assert feed_endpoint(from_completion, minutes + done)[-1] == 5


def test_nothing_rescales_while_the_endpoint_is_updating() -> None:
    # Scale-out to 3 at t=180; at t=240 the 2 new instances are still booting and the
    # load jumps to 1000/min. SageMaker's endpoint is Updating: no new activity, even a
    # larger one; once it is InService (t=300) the step sizes from the load at once
    # (still in the cooldown): ceil(1000 / 100) = 10.
    minutes: list[EndpointMinute] = [(60.0 * k, 250.0, 1, False, None) for k in (1, 2, 3)]
    surge = [*minutes, (240.0, 1000.0, 1, True, None), (300.0, 1000.0, 3, False, 290.0)]
    assert feed_endpoint(SM, surge) == [1, 1, 3, 3, 10]
    # Without the block the larger scale-out goes out at t=240.
    free = replace(SM, block_while_updating=False)
    assert feed_endpoint(free, surge)[:4] == [1, 1, 3, 10]
    # Nor does a scale-in start during an update.
    low = TargetTrackingState(desired=4, datapoints=(10.0, 10.0))
    assert feed_endpoint(SM, [(900.0, 40.0, 4, True, None)], low) == [4]
    assert feed_endpoint(SM, [(900.0, 40.0, 4, False, 0.0)], low) == [1]


@pytest.mark.parametrize(("delay", "reacts_at"), [(0.0, 180.0), (60.0, 240.0), (120.0, 300.0)])
def test_the_metric_delay_shifts_the_reaction_by_that_much(delay: float, reacts_at: float) -> None:
    # 250/min from the first minute: the 3rd high datapoint is the minute ending at t=180;
    # the alarm sees it `delay` later, and scales out then.
    cfg = TargetTrackingConfig(100.0, max_capacity=10, metric_delay_s=delay)
    state = TargetTrackingState(desired=1)
    first = None
    for k in range(1, 10):
        now = 60.0 * k
        desired, state = target_tracking_step(
            cfg, state, now_s=now, invocations_last_minute=250.0, in_service=1
        )
        if desired > 1 and first is None:
            first = now
    assert first == reacts_at


def test_a_delay_off_the_minute_grid_acts_at_the_next_evaluation() -> None:
    # 90 s: the datapoint of the minute ending at 180 is visible at 270, seen at t=300.
    cfg = TargetTrackingConfig(100.0, max_capacity=10, metric_delay_s=90.0)
    minutes = [(60.0 * k, 250.0, 1) for k in range(1, 6)]
    assert feed(TargetTrackingState(desired=1), minutes, cfg) == [1, 1, 1, 1, 3]


def test_sagemaker_config_sets_the_delay_and_both_rules() -> None:
    cfg = sagemaker_config_for(10.0)
    assert cfg.target_invocations_per_instance == 300.0
    assert cfg.metric_delay_s == DEFAULT_METRIC_DELAY_S == 60.0
    assert cfg.cooldown_from_completion and cfg.block_while_updating
    kind = config_for(10.0)
    assert kind.metric_delay_s == 0.0
    assert not kind.cooldown_from_completion and not kind.block_while_updating
    with pytest.raises(ValueError):
        TargetTrackingConfig(100.0, metric_delay_s=-1.0)


def test_simulate_as_sagemaker_reacts_a_minute_later_and_waits_for_the_update() -> None:
    # The replay of test_simulate_capacity_counts_boot_time... with SageMaker's rules:
    # 100/min for 2 minutes, then 250/min. The datapoints of minutes 2, 3, 4 are above
    # target; the alarm sees minute 4's at t=360 (not 300): desired 3, serving from
    # 360 + 90 = 450, i.e. from minute 8 (t=480).
    series = [100.0] * 2 + [250.0] * 10
    sm = replace(SM, metric_delay_s=60.0, datapoints_in=15)
    got = simulate(series, sm, boot_s=90.0, initial=1)
    assert got.in_service == [1] * 8 + [3] * 4
    assert got.provisioned == [1] * 6 + [3] * 6
