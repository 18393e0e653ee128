"""The data plane's routing rule, by hand-computed cases (dispatcher and simulator share it)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from bouncer.admission import Backlog
from bouncer.latency import BatchLatency
from bouncer.routing import (
    allowance_after,
    due_at,
    fill,
    finish_if_sent,
    pick,
    spill_cap,
    spill_chunks,
    window_end,
)


@dataclass
class _B:
    instance_id: str
    latency: BatchLatency
    busy_until: float = 0.0


FAST = BatchLatency.from_mapping({1: 0.05})
SLOW = BatchLatency.from_mapping({1: 0.2})


def test_the_instance_that_finishes_one_more_request_soonest_is_picked() -> None:
    fast, slow = _B("i-fast", FAST, busy_until=10.3), _B("i-slow", SLOW)
    assert finish_if_sent(10.0, 10.3, 0.05) == pytest.approx(10.35)
    assert pick(10.0, [fast, slow]) is slow  # 10.2 beats 10.35
    fast.busy_until = 10.1
    assert pick(10.0, [slow, fast]) is fast  # 10.15 beats 10.2
    assert pick(10.0, []) is None


def test_a_tie_goes_to_the_smaller_instance_id() -> None:
    a, b = _B("i-a", FAST, busy_until=9.0), _B("i-b", FAST, busy_until=3.0)
    assert pick(10.0, [b, a]) is a  # both idle: the same finish, whatever they did before


def test_a_batch_takes_what_waits_then_fills_until_its_window_ends() -> None:
    # N_batch 4, W_batch 0.2 s: opened at 0.0, it takes 0.05 and 0.1, then goes at 0.2.
    arr = [0.0, 0.05, 0.1, 1.0]
    assert window_end(0.0, 0.2) == pytest.approx(0.2)
    taken, goes_at = fill(arr, 0, len(arr), 0.0, 4, 0.2)
    assert taken == 3 and goes_at == pytest.approx(0.2)
    # Full before its window ends: it goes when the N_batch-th request arrives.
    assert fill([0.0, 0.01, 0.02, 0.03, 0.04], 0, 5, 0.0, 4, 0.2) == (4, 0.03)
    # Opened late (the batcher was busy until 0.5): everything waiting joins, up to
    # N_batch, and the batch goes at once.
    assert due_at(0.5, 0.2) == 0.5
    assert fill(arr, 0, len(arr), 0.5, 4, 0.2) == (3, 0.5)
    # N_batch 1: one request, now.
    assert fill(arr, 1, len(arr), 0.07, 1, 0.0) == (2, 0.07)


def test_the_backlog_re_anchors_busy_until_when_a_batch_ends() -> None:
    q = Backlog()
    t = BatchLatency.from_mapping({1: 0.1})
    first = q.offer(1000.0, [1010.0], t)
    second = q.offer(1000.0, [1010.0], t)
    assert q.depth == 2 and q.busy_until == pytest.approx(1000.2)
    q.done(1000.5, first)  # the first ran 0.5 s instead of 0.1 s
    assert q.busy_until == pytest.approx(1000.6)
    assert q.offer(1000.5, [1000.65], t).rejected == (0,)
    q.done(1000.7, second)
    assert (q.depth, q.busy_until) == (0, 1000.7)
    # Without a Bouncer everything queues: a batch of 3 after the one running.
    q.take(1000.7, 1, t)
    whole = q.take(1000.75, 3, t)
    assert whole.admitted == (0, 1, 2) and whole.finish == pytest.approx(1000.8 + 0.3)


def test_the_transport_allowance_rises_fast_on_late_results_and_falls_slowly() -> None:
    a = 0.0
    for _ in range(5):
        a = allowance_after(a, 0.020, cap_s=0.5)
    assert 0.018 < a <= 0.020  # five late batches: nearly all of the lateness
    high = a
    for _ in range(5):
        a = allowance_after(a, 0.0, cap_s=0.5)
    assert 0.8 * high < a < high  # five on time: still most of it
    for _ in range(500):
        a = allowance_after(a, 0.0, cap_s=0.5)
    assert a < 0.001  # on time for long: back near nothing


def test_the_transport_allowance_ignores_early_results_and_is_capped() -> None:
    assert allowance_after(0.0, -0.3, cap_s=0.5) == 0.0  # early is on time
    a = 0.0
    for _ in range(50):
        a = allowance_after(a, 10.0, cap_s=0.25)  # a stall is not a transport time
    assert a <= 0.25


# A spill function whose batch of 4 takes 2.2 T_1 (measured up to 8).
SPILL = BatchLatency.from_mapping({1: 0.1, 2: 0.15, 4: 0.22, 8: 0.4})


def test_spilled_requests_share_invocations_the_function_finishes_by_their_deadlines() -> None:
    deadlines = [1.30, 1.25, 1.20, 1.40, 1.35]
    chunks = spill_chunks(1.0, deadlines, SPILL)
    # Every request in exactly one invocation, taken in deadline order.
    assert sorted(i for c in chunks for i in c) == [0, 1, 2, 3, 4]
    assert [i for c in chunks for i in c] == sorted(range(5), key=deadlines.__getitem__)
    for c in chunks:
        assert 1.0 + SPILL(len(c)) <= min(deadlines[i] for i in c) + 1e-12
    # The earliest deadline (1.20) allows 0.20 s: a chunk of 3 (0.185 s), not 4 (0.22 s);
    # the other two then fit one more invocation.
    assert [len(c) for c in chunks] == [3, 2]


def test_a_chunk_never_outgrows_the_largest_batch_measured() -> None:
    chunks = spill_chunks(0.0, [10.0] * 20, SPILL)
    assert spill_cap(SPILL) == 8
    assert [len(c) for c in chunks] == [8, 8, 4]


def test_a_request_that_misses_even_alone_goes_alone() -> None:
    assert spill_chunks(1.0, [1.05, 1.06, 1.07], SPILL) == [[0], [1], [2]]


def test_a_chunk_grows_only_while_one_more_request_costs_no_more_than_its_own_call() -> None:
    # Superlinear past 2 (T_3 = 0.35 > T_2 + T_1): batching 3 would cost more than 2 + 1.
    worse = BatchLatency.from_mapping({1: 0.1, 2: 0.2, 3: 0.35})
    assert [len(c) for c in spill_chunks(0.0, [5.0] * 6, worse)] == [2, 2, 2]


def test_without_a_batch_curve_every_spilled_request_is_its_own_invocation() -> None:
    assert spill_cap(None) == 1
    assert spill_chunks(0.0, [3.0, 1.0, 2.0], None) == [[1], [2], [0]]
