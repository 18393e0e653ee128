"""Spill evidence: what the planner learns from spilled requests, and the rules it drives."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provisioner.pooling import pool_with
from provisioner.spill_evidence import (
    IN_TIME_SHARE,
    LATE_MEMORY,
    MEMORY,
    MIN_SEEN,
    SpillEvidence,
)


def test_nothing_is_decided_before_enough_spills_were_seen() -> None:
    few = SpillEvidence().observe(within=int(MIN_SEEN) - 1, total=int(MIN_SEEN) - 1, cost=0.01)
    assert not few.known and not few.in_time() and few.cost_per_request() is None
    enough = few.observe(within=2, total=2, cost=0.0)  # 19 faded a little: 2 more
    assert enough.known and enough.in_time()


def test_counts_and_cost_fold_in_and_the_price_is_cost_per_request() -> None:
    e = SpillEvidence().observe(within=30, total=40, cost=40 * 2e-5)
    keep = (1.0 - 1.0 / MEMORY) ** 40
    assert e.seen == 40 and e.within == 30
    assert e.cost_per_request() == pytest.approx(2e-5)
    e2 = e.observe(within=10, total=40, cost=40 * 4e-5)
    assert e2.seen == pytest.approx(40 * keep + 40)
    assert e2.within == pytest.approx(30 * keep + 10)
    assert e2.cost_per_request() == pytest.approx((8e-4 * keep + 1.6e-3) / (40 * keep + 40))


def test_in_time_follows_the_median_spill_and_old_evidence_fades() -> None:
    slow = SpillEvidence().observe(within=0, total=200, cost=0.0)  # cold or slow spill
    assert slow.known and not slow.in_time()
    warmed = slow
    for _ in range(10):
        warmed = warmed.observe(within=50, total=50, cost=0.0)
    assert warmed.in_time()  # 500 in-time spills outweigh 200 faded misses
    assert warmed.within / warmed.seen > IN_TIME_SHARE


def test_an_empty_interval_changes_nothing_and_errors_count_as_misses() -> None:
    e = SpillEvidence(seen=100.0, within=80.0, cost=0.002)
    assert e.observe(within=0, total=0, cost=0.0) is e
    assert e.observe(within=5, total=3, cost=-1.0) == SpillEvidence(
        100.0 * (1 - 1 / MEMORY) ** 3 + 3,
        80.0 * (1 - 1 / MEMORY) ** 3 + 3,
        0.002 * (1 - 1 / MEMORY) ** 3,
        3.0,
        3.0,
    )


def test_spill_is_late_for_good_only_when_it_misses_over_the_long_memory_too() -> None:
    """A spill that never answers in time (NASNet's 2.2 s against 1 s) is late; one that
    does, hit by a burst of cold starts, is not in time lately but not late either."""
    assert not SpillEvidence().late()  # nothing known
    never = SpillEvidence().observe(within=0, total=int(MIN_SEEN), cost=0.0)
    assert never.late() and not never.in_time()
    usually = SpillEvidence()
    for _ in range(40):
        usually = usually.observe(within=200, total=250, cost=0.0)  # 80 % in time
    burst = usually.observe(within=100, total=3000, cost=0.0)  # cold starts
    assert not burst.in_time() and not burst.late()
    assert burst.seen_long < LATE_MEMORY and burst.within_long / burst.seen_long > IN_TIME_SHARE
    for _ in range(30):
        burst = burst.observe(within=0, total=1000, cost=0.0)  # and then late for good
    assert burst.late()


@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 500), st.floats(0, 1)), max_size=30))
def test_within_never_exceeds_seen_and_the_price_stays_finite(
    rounds: list[tuple[int, int, float]],
) -> None:
    e = SpillEvidence()
    for within, total, cost in rounds:
        e = e.observe(within, total, cost)
        assert 0.0 <= e.within <= e.seen + 1e-9
        price = e.cost_per_request()
        assert price is None or (math.isfinite(price) and price > 0)


def test_pool_with_follows_the_mode_or_under_auto_the_evidence() -> None:
    fast = SpillEvidence().observe(within=100, total=100, cost=0.002)
    slow = SpillEvidence().observe(within=10, total=100, cost=0.002)
    assert pool_with(True, slow) and not pool_with(False, fast)
    assert pool_with("auto", fast) and not pool_with("auto", slow)
    assert not pool_with("auto", SpillEvidence())  # nothing seen: stand-alone, as the paper
