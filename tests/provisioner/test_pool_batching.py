"""Batching for a pool: larger batches where only a pool fills them, the alone rule elsewhere."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bouncer.latency import BatchLatency
from mark.daemon import backend_for, pool_sizes
from provisioner.batching import PROFILE_BATCHES, serving_batching
from provisioner.perf_model import InstancePerf, pooled_capacity
from provisioner.pool_batching import batching_for, candidates, pool_batching

RT, SL = 1.0, 0.98
# NASNet on a p2.xlarge (the paper's profile): eight requests take as long as one.
FLAT = BatchLatency(((1, 0.632), (8, 0.632), (16, 1.263), (32, 2.526)))
# A CPU that gains nothing from batching: b requests take b times one.
LINEAR = BatchLatency(tuple((b, 0.2 * b) for b in PROFILE_BATCHES))


def _alone_pool(latency: BatchLatency) -> dict[int, float]:
    n, w = serving_batching(latency, RT)
    return dict(pooled_capacity(InstancePerf(latency(n), n, w), RT, SL))


def test_a_flat_profile_batches_in_a_pool_and_carries_more_per_instance() -> None:
    alone = _alone_pool(FLAT)
    table = pool_batching(FLAT, RT, SL)
    assert serving_batching(FLAT, RT) == (1, 0.0)  # alone: a second batch behind one misses
    assert [p.size for p in table] == sorted(alone)
    for p in table:
        assert p.capacity_rps >= alone[p.size]
    big = {p.size: p for p in table if p.size >= 4}
    for p in big.values():  # the measured gain, several times the alone rule's
        assert p.n_batch > 1 and 0 < p.w_batch_s < RT - FLAT(p.n_batch)
        assert p.capacity_rps > 3 * alone[p.size]


def test_a_profile_with_no_faster_batch_keeps_the_alone_rule_at_every_size() -> None:
    n, w = serving_batching(LINEAR, RT)
    assert candidates({b: LINEAR(b) for b in PROFILE_BATCHES}, RT, n / LINEAR(n)) == []
    table = pool_batching(LINEAR, RT, SL)
    assert {p.size: p.capacity_rps for p in table} == _alone_pool(LINEAR)
    assert {(p.n_batch, p.w_batch_s) for p in table} == {(n, w)}
    assert {batching_for(LINEAR, RT, SL, k) for k in (1, 2, 3, 9, 100)} == {(n, w)}


def test_the_batching_served_follows_the_pool_size() -> None:
    table = {p.size: (p.n_batch, p.w_batch_s) for p in pool_batching(FLAT, RT, SL)}
    assert batching_for(FLAT, RT, SL, 1) == serving_batching(FLAT, RT)
    assert batching_for(FLAT, RT, SL, 5) == table[4]  # the largest measured size not above
    assert batching_for(FLAT, RT, SL, 1000) == table[max(table)]
    # The daemon's dispatcher backends batch by the same rule.
    one = backend_for("i-1", "p2.xlarge", "http://a", FLAT, RT, sl_min=SL)
    four = backend_for("i-1", "p2.xlarge", "http://a", FLAT, RT, sl_min=SL, pool_size=4)
    assert (one.n_batch, one.w_batch_s) == serving_batching(FLAT, RT)
    assert (four.n_batch, four.w_batch_s) == table[4]


def test_an_instance_being_retired_is_no_part_of_its_type_s_pool() -> None:
    """While the controller drains one of three p2.xlarge before terminating it, the other
    two batch for a pool of two: the third takes no new batch."""
    fleet = [("i-1", "p2.xlarge"), ("i-2", "p2.xlarge"), ("i-3", "p2.xlarge"), ("i-4", "c5.large")]
    assert pool_sizes(fleet, frozenset()) == {"p2.xlarge": 3, "c5.large": 1}
    assert pool_sizes(fleet, {"i-3", "i-9"}) == {"p2.xlarge": 2, "c5.large": 1}


@settings(max_examples=15, deadline=None)
@given(
    t1=st.floats(0.05, 0.5),
    flat_to=st.sampled_from([1, 2, 4, 8]),
    rt=st.floats(0.6, 1.5),
)
def test_a_pool_never_plans_less_than_the_alone_rule(t1: float, flat_to: int, rt: float) -> None:
    """Whatever the profile, each pool size carries at least what the alone rule's batching
    does there, and a chosen batch fits RT_max with its window."""
    latency = BatchLatency(tuple((b, t1 * max(1, b / flat_to)) for b in PROFILE_BATCHES))
    if latency(1) > rt:
        return
    n, w = serving_batching(latency, rt)
    alone = dict(pooled_capacity(InstancePerf(latency(n), n, w), rt, SL))
    for p in pool_batching(latency, rt, SL):
        assert p.capacity_rps >= alone[p.size]
        assert p.w_batch_s + latency(p.n_batch) <= rt + 1e-9


def test_a_window_share_leaves_room_below_rt_max() -> None:
    pairs = candidates({b: FLAT(b) for b in PROFILE_BATCHES}, RT, 1 / FLAT(1))
    assert pairs and all(w + FLAT(b) < RT for b, w in pairs)
    assert {b for b, _ in pairs} == {2, 4, 8}  # 16 and 32 take longer than RT_max allows
    assert pytest.approx(max(w for _, w in pairs)) == 0.8 * (RT - 0.632)
