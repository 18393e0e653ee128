"""The miss budget: how many requests may be declined, by hand-computed cases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bouncer.miss_budget import BUCKET_S, MissBudget, MissTally, declinable


def test_declinable_is_the_share_of_the_allowance_less_the_misses() -> None:
    # 98 % within RT_max on 10,000 requests allows 200 misses; half is 100.
    assert declinable(10_000, 0, 0.98, 0.5, involuntary=0) == 100
    assert declinable(10_000, 30, 0.98, 0.5, involuntary=30) == 70  # misses nobody chose count
    assert declinable(10_000, 150, 0.98, 0.5, involuntary=0) == 0  # never negative
    assert declinable(10_000, 0, 0.98, 0.0, involuntary=0) == 0  # share 0: never decline
    assert declinable(0, 0, 0.98, 1.0, involuntary=0) == 0
    assert declinable(99, 0, 0.98, 0.5, involuntary=0) == 0  # 0.99 of a request is none


def test_the_reserve_is_the_involuntary_misses_again_where_they_are_more() -> None:
    # 200 allowed; share 0.9 keeps 20 back, or the misses nobody chose if more.
    assert declinable(10_000, 10, 0.98, 0.9, involuntary=10) == 170  # 180 − 10
    assert declinable(10_000, 40, 0.98, 0.9, involuntary=40) == 120  # 200 − 40 − 40
    assert declinable(10_000, 60, 0.98, 0.9, involuntary=20) == 120  # 40 declined: 180 − 60
    assert declinable(10_000, 150, 0.98, 0.9, involuntary=100) == 0  # 200 − 100 < 150


def test_the_budget_counts_what_was_declined_apart_from_what_missed() -> None:
    b = MissBudget(sl_min=0.98, share=0.9)
    b.arrive(0.0, 10_000)
    assert b.declinable(0.0) == 180
    assert b.decline(0.0, 100) == 100
    assert b.declinable(0.0) == 80  # declines do not grow the reserve
    b.miss(1.0, 40)  # late answers: the reserve is now 40, not 20
    assert b.declinable(1.0) == 200 - 40 - 140
    assert (b.declined, b.missed) == (100, 140)


def test_declines_stop_when_the_windows_share_is_spent() -> None:
    b = MissBudget(sl_min=0.99, share=0.5)
    b.arrive(0.0, 1000)  # 1 % of 1,000 is 10 misses; half is 5
    assert b.decline(1.0, 3) == 3
    b.miss(2.0, 1)  # a late Lambda answer
    assert b.declinable(3.0) == 1
    assert b.decline(3.0, 10) == 1
    assert b.decline(4.0, 1) == 0
    assert (b.missed, b.declined_total) == (5, 4)


def test_the_window_forgets_an_hour_ago() -> None:
    b = MissBudget(sl_min=0.99, share=1.0, window_s=60.0)
    b.arrive(0.0, 1000)
    assert b.decline(0.0, 100) == 10
    b.arrive(30.0, 1000)
    assert b.declinable(30.0) == 10  # 20 allowed on 2,000, 10 spent
    # A minute and a bucket later the first 1,000 and their 10 misses have left.
    b.arrive(60.0 + BUCKET_S, 0)
    assert (b.arrived, b.missed) == (1000, 0)
    assert b.declinable(60.0 + BUCKET_S) == 10


def test_bad_shares_are_refused() -> None:
    with pytest.raises(ValueError, match="share"):
        MissBudget(sl_min=0.98, share=1.5)
    with pytest.raises(ValueError, match="sl_min"):
        MissBudget(sl_min=0.0, share=0.5)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 30.0),  # seconds since the last event
            st.integers(0, 500),  # arrivals
            st.integers(0, 50),  # requests wanting to be declined
            st.integers(0, 3),  # misses nobody chose
        ),
        min_size=1,
        max_size=60,
    ),
    st.sampled_from([0.9, 0.98, 0.999]),
    st.floats(0.0, 1.0),
)
def test_misses_in_any_window_stay_within_the_share(
    events: list[tuple[float, int, int, int]], sl_min: float, share: float
) -> None:
    # Whatever the load, right after a decline the window's misses (declined or not)
    # are within share × (1 - SL_min) of its arrivals, with room for the involuntary
    # ones again: declines never overdraw it.
    b = MissBudget(sl_min=sl_min, share=share, window_s=120.0)
    now = 0.0
    for gap, arrived, wanted, involuntary in events:
        now += gap
        b.arrive(now, arrived)
        b.miss(now, involuntary)
        if b.decline(now, wanted) > 0:
            allowance = (1.0 - sl_min) * b.arrived
            assert b.missed <= share * allowance + 1e-6
            # and as many misses again as nobody chose still fit the allowance
            assert b.missed + (b.missed - b.declined) <= allowance + 1e-6
        assert 0 <= b.declinable(now) <= max(0, share * (1.0 - sl_min) * b.arrived)


def test_the_tally_is_the_windows_arrivals_and_misses_at_a_time() -> None:
    b = MissBudget(sl_min=0.98, share=0.75, window_s=60.0)
    b.arrive(0.0, 1000)
    b.miss(0.0, 7)
    assert b.tally(30.0) == (1000, 7)
    assert b.tally(60.0 + BUCKET_S) == (0, 0)  # the window has moved past them


def test_the_default_period_is_a_day() -> None:
    # A rise late in the day may spend what its quiet hours allowed; a day later it is gone.
    b = MissBudget(sl_min=0.99, share=1.0)
    b.arrive(0.0, 1000)
    assert b.declinable(7200.0) == 10  # two hours on, the first 1,000 still count
    assert b.decline(7200.0, 4) == 4
    assert b.declinable(86_400.0 + BUCKET_S) == 0  # a day and a bucket on, all have left


def test_the_tally_is_the_last_hour_whatever_the_period() -> None:
    # The planner judges what rises may still miss on the last hour's count only.
    b = MissBudget(sl_min=0.98, share=0.75)
    b.arrive(0.0, 1000)
    b.miss(0.0, 7)
    b.arrive(4000.0, 500)
    b.miss(4000.0, 2)
    assert b.tally(4000.0) == (500, 2)
    assert b.tally(4000.0, span_s=86_400.0) == (1500, 9) == (b.arrived, b.missed)


def test_the_planner_is_told_the_last_hour_and_the_period() -> None:
    b = MissBudget(sl_min=0.98, share=0.0)  # declines off: it still counts
    b.arrive(0.0, 1000)
    b.miss(0.0, 7)
    b.arrive(4000.0, 500)
    b.miss(4000.0, 2)
    assert b.count(4000.0) == MissTally(500, 2, 1500, 9)
    assert b.declinable(4000.0) == 0
    two = MissTally(10, 1, 100, 3).merged(MissTally(20, 0, 50, 1))
    assert two == MissTally(30, 1, 150, 4)
