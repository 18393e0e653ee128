"""§4.5 spot policy: standby pool, interruption response, avoidance, spread."""

import pytest

from provisioner.greedy import PlannerOption
from provisioner.spot import (
    InterruptionMemory,
    SpotHolding,
    Standby,
    avoid_interrupted,
    capacity_at_risk,
    diversify_spot,
    on_interruption_notice,
    record_interruption,
    standby_pool_size,
    standbys_to_start,
    standbys_to_stop,
)

P2 = ("p2.xlarge", "spot")
C5 = ("c5.xlarge", "spot")


def test_pool_covers_the_largest_offering_or_the_loss_fraction() -> None:
    one_pool = [SpotHolding(P2, 4, 55.0)]
    assert capacity_at_risk(one_pool, 0.25) == pytest.approx(220)
    assert standby_pool_size(one_pool, standby_capacity_rps=10.0) == 22
    spread = [SpotHolding(P2, 2, 55.0), SpotHolding(C5, 11, 10.0)]
    # Diversified: the largest pool is 110 r/s, 25 % of 220 is 55: cover 110.
    assert standby_pool_size(spread, 10.0, loss_fraction=0.25) == 11
    # A correlated-loss assumption can ask for more.
    assert standby_pool_size(spread, 10.0, loss_fraction=0.75) == 17
    assert standby_pool_size([], 10.0) == 0


def test_interruption_starts_the_fewest_standbys_covering_the_loss() -> None:
    stopped = [Standby("s-small", 5.0), Standby("s-big-1", 20.0), Standby("s-big-2", 20.0)]
    decision = standbys_to_start(30.0, stopped)
    assert decision.start == ("s-big-1", "s-big-2")
    assert decision.uncovered_rps == 0.0
    short = standbys_to_start(60.0, stopped)
    assert len(short.start) == 3
    assert short.uncovered_rps == pytest.approx(15.0)


def test_standbys_stop_as_replacements_take_over() -> None:
    active = [Standby("s-1", 20.0), Standby("s-2", 20.0), Standby("s-3", 5.0)]
    assert standbys_to_stop(active, still_needed_rps=45.0) == ()
    assert standbys_to_stop(active, still_needed_rps=15.0) == ("s-2", "s-3")
    assert set(standbys_to_stop(active, still_needed_rps=0.0)) == {"s-1", "s-2", "s-3"}


def test_interrupted_offering_is_avoided_for_the_ttl() -> None:
    p2 = PlannerOption("p2.xlarge", "spot", 0.27, 55.0)
    c5 = PlannerOption("c5.xlarge", "spot", 0.07, 8.0)
    memory = record_interruption(InterruptionMemory(), P2, now=1000.0)
    assert avoid_interrupted([p2, c5], memory, 1000.0) == [c5]
    assert avoid_interrupted([p2, c5], memory, 1179.0) == [c5]
    assert avoid_interrupted([p2, c5], memory, 1180.0) == [p2, c5]
    # Expired entries are dropped when a new one is recorded.
    later = record_interruption(memory, C5, now=2000.0)
    assert later.avoid_until == {C5: 2180.0}


def test_spot_capacity_is_spread_over_offerings() -> None:
    cheap = PlannerOption("c6i.xlarge", "spot", 0.06, 10.0)
    mid = PlannerOption("c5.xlarge", "spot", 0.07, 10.0)
    dear = PlannerOption("m5.xlarge", "spot", 0.09, 10.0)
    counts = diversify_spot(100.0, [dear, mid, cheap], max_share=0.5)
    assert counts == {cheap.key: 5, mid.key: 5}
    counts = diversify_spot(100.0, [dear, mid, cheap], max_share=0.34)
    # Caps give 3 each (90 r/s); the last 10 go to the cheapest.
    assert counts == {cheap.key: 4, mid.key: 3, dear.key: 3}
    # With one offering coverage wins over spread.
    assert diversify_spot(100.0, [cheap], max_share=0.5) == {cheap.key: 10}


def test_notice_starts_standbys_and_avoids_the_offering() -> None:
    p2 = PlannerOption("p2.xlarge", "spot", 0.27, 55.0)
    stopped = [Standby(f"s-{n}", 10.0) for n in range(8)]
    response = on_interruption_notice(P2, 55.0, stopped, InterruptionMemory(), now=50.0)
    assert len(response.start) == 6
    assert response.uncovered_rps == 0.0
    assert avoid_interrupted([p2], response.memory, 100.0) == []
