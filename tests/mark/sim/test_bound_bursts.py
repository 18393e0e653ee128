"""The bound's burst rows (``mark.sim.bound_bursts``): what one instance can do in a
short interval, which intervals are rows, a hand-computed optimum where they bind, exact
pruning with them, and no simulated policy below the bound they raise."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bouncer.latency import BatchLatency
from mark.sim.bound import (
    BoundOffering,
    burst_rows,
    serve_times,
    slo_rate,
    slot_counts,
    system_bound,
)
from mark.sim.bound_bursts import burst_lengths, bursts, caps
from mark.sim.compare import compare
from mark.sim.models import SimModel
from mark.sim.policies import POLICIES
from mark.sim.run import SimConfig
from mark.sim.workloads import Workload

RT = 1.0
SLOT = 5.0
KAPPA = 1.0 + RT / 60.0
SLOW = BatchLatency(((1, 0.7), (2, 1.4)))  # NASNet on c5.xlarge, near enough: one at a time


def _offering(curve: BatchLatency, price: float = 0.36, name: str = "c5.large") -> BoundOffering:
    return BoundOffering(name, "on-demand", price, slo_rate(curve, RT), latency=curve)


def _brute_cap(curve: BatchLatency, length: float) -> int:
    """The most requests batches with T_n ≤ RT_max hold in ``length`` seconds, by trying
    every multiset of at most six batches."""
    sizes = [n for n in range(1, 9) if curve(n) <= RT + 1e-9]
    best = 0
    for k in range(1, 7):
        for combo in itertools.combinations_with_replacement(sizes, k):
            if sum(curve(n) for n in combo) <= length + 1e-9:
                best = max(best, sum(combo))
    return best


def test_one_at_a_time_an_instance_answers_one_per_batch_time() -> None:
    tau = serve_times(_offering(SLOW), RT, 5.0)
    assert tau[:4] == pytest.approx([0.0, 0.7, 1.4, 2.1])  # T_2 = 1.4 s > RT_max: never
    got = caps(tau, np.array([1.0, 1.399, 1.4, 2.2]))
    assert got.tolist() == [1, 1, 2, 3]


@pytest.mark.parametrize(
    "curve",
    [
        BatchLatency(((1, 0.3), (3, 0.3), (4, 0.55))),
        BatchLatency(((1, 0.2), (2, 0.25), (4, 0.45), (8, 0.95))),
        BatchLatency(((1, 0.45),)),
    ],
)
def test_what_an_instance_holds_in_a_short_interval_is_the_best_mix_of_batches(
    curve: BatchLatency,
) -> None:
    tau = serve_times(_offering(curve), RT, 3.0)
    lengths = np.linspace(0.0, 2.0, 81)
    assert caps(tau, lengths).tolist() == [_brute_cap(curve, x) for x in lengths]


def test_the_interval_lengths_stop_just_short_of_where_an_instance_holds_one_more() -> None:
    tau = serve_times(_offering(SLOW), RT, 7.0)
    # cap steps at 1.4, 2.1, 2.8 ... s of I'; I is that less RT_max, less a microsecond.
    assert burst_lengths([tau], RT, SLOT, 3) == pytest.approx([0.4, 1.1, 1.8], abs=1e-5)


def test_each_slot_gets_its_fullest_interval_per_length_and_implied_rows_go() -> None:
    t0 = 100.0
    # Slot 0: three within 0.2 s, a fourth 0.9 s later; slot 1: one request; slot 2: none.
    arrivals = t0 + np.array([0.5, 0.6, 0.7, 1.6, 7.0])
    rows = bursts(arrivals, t0, 15.0, SLOT, RT, [0.4, 1.1, 1.8])
    got = sorted(
        zip(
            rows.slot.tolist(),
            rows.count.tolist(),
            rows.reach_s.round(6).tolist(),
            rows.last.tolist(),
            strict=True,
        )
    )
    # Slot 0: 3 within 0.4 s (I' 0.2 + 1.0 long), 4 within 1.1 s; 1.8 s adds none: dropped.
    # Slot 1: one request, once (the longer lengths hold no more). I' of each ends in the
    # slot it starts in (t0 + 1.7, t0 + 2.6, t0 + 8.0).
    assert got == [(0, 3, 1.2, 0), (0, 4, 2.1, 0), (1, 1, 1.0, 1)]


def test_bursts_of_three_need_three_instances_a_minute_around_each() -> None:
    """Three requests at once every 10 s, a 0.7 s batch each with RT_max 1 s: one instance
    answers one of them in time, so three must run at each burst, and each is billed a
    minute from its start. A schedule that meets the SLO: three runs from a burst until
    the sixth burst after it (60.72 s), then three new ones at the next burst, 70 s on. The
    bound is at most that schedule's cost and, with the burst rows, within 20 % of it; the
    fluid LP pays for 0.21 of one instance (0.3 r/s at 1.43 r/s each), a tenth of it."""
    t0, seconds = 1_000.0, 600.0
    starts = t0 + np.arange(2.0, seconds, 10.0)  # t0 + 2, 12, ..., 592
    arrivals = np.sort(np.concatenate([starts, starts + 0.01, starts + 0.02]))
    o = _offering(SLOW)
    counts = slot_counts(arrivals, t0, seconds, SLOT)
    kw: dict[str, object] = {"rt_max_s": RT, "miss_budget": 0, "lam": None, "slot_s": SLOT}
    fluid = system_bound(counts, [o], **kw).value  # type: ignore[arg-type]
    rows = burst_rows(arrivals, t0, seconds, SLOT, [o], RT)
    bound = system_bound(counts, [o], bursts=rows, **kw).value  # type: ignore[arg-type]
    runs = [min(60.72, 592.72 - first) for first in np.arange(2.0, 592.0, 70.0)]
    schedule = 3 * sum(max(60.0, r) for r in runs) * 0.36 / 3600
    assert 0.8 * schedule <= bound <= schedule
    assert fluid < 0.1 * bound
    # With two of every burst allowed to miss, one instance is enough.
    kw["miss_budget"] = 2 * starts.size
    one = system_bound(counts, [o], bursts=rows, **kw).value  # type: ignore[arg-type]
    assert one == pytest.approx(bound / 3, rel=0.05)


@pytest.mark.parametrize("seed", range(3))
def test_pruning_with_burst_rows_never_changes_the_value(seed: int) -> None:
    """An offering dearer per rate but with more cap per dollar in a short interval is kept."""
    rng = np.random.default_rng(seed)
    curves = [
        BatchLatency(((1, float(rng.uniform(0.2, 0.9))),)),
        BatchLatency(((1, float(rng.uniform(0.1, 0.5))), (2, float(rng.uniform(0.5, 1.0))))),
        BatchLatency(((1, float(rng.uniform(0.05, 0.3))),)),
    ]
    offerings = [_offering(c, float(rng.uniform(0.1, 1.0)), f"t{i}") for i, c in enumerate(curves)]
    t0, seconds = 0.0, 300.0
    arrivals = np.sort(rng.uniform(t0, t0 + seconds, int(rng.integers(50, 1500))))
    counts = slot_counts(arrivals, t0, seconds, SLOT)
    rows = burst_rows(arrivals, t0, seconds, SLOT, offerings, RT)
    kw: dict[str, object] = {
        "rt_max_s": RT,
        "miss_budget": int(counts.sum()) // 50,
        "lam": None,
        "slot_s": SLOT,
        "bursts": rows,
    }
    pruned = system_bound(counts, offerings, prune=True, **kw).value  # type: ignore[arg-type]
    full = system_bound(counts, offerings, prune=False, **kw).value  # type: ignore[arg-type]
    assert pruned == pytest.approx(full, rel=1e-6)


EPOCH = 1_700_000_000.0
HISTORY_S = 2 * 3600


def _slow_model() -> SimModel:
    """A NASNet in small: batches take most of RT_max and Lambda cannot answer in time."""
    return SimModel(
        name="slow",
        rt_max_s=RT,
        sl_min=0.98,
        latency={
            "c5.large": BatchLatency(((1, 0.7), (2, 1.4))),
            "c5.xlarge": BatchLatency(((1, 0.45), (2, 0.9))),
        },
        lambda_t1_s=2.0,
        standby_t1_s=0.7,
    )


@st.composite
def _bursty_loads(draw: st.DrawFn) -> np.ndarray:
    """A few minutes of a load of a few requests per second, with bursts."""
    piece = st.tuples(st.integers(60, 240), st.sampled_from([0.2, 1.0, 3.0, 6.0]))
    rates = np.concatenate(
        [np.full(d, r) for d, r in draw(st.lists(piece, min_size=1, max_size=3))]
    )
    for at, d, r in draw(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 5),
                                            st.floats(5.0, 30.0)), max_size=2)):  # fmt: skip
        rates[at : at + d] += r
    return rates


@settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(load=_bursty_loads(), seed=st.integers(0, 100))
async def test_no_simulated_policy_costs_less_than_the_bound_with_burst_rows(
    load: np.ndarray, seed: int
) -> None:
    seconds = int(load.size)
    per_second = np.concatenate([np.full(HISTORY_S, max(float(load[0]), 0.2)), load])
    w = Workload("bursty", per_second, EPOCH, HISTORY_S, seconds)
    cfg = SimConfig(warmup_s=300, seed=seed, boot_s=60, milp_time_limit_s=5)
    names = ("mark", "mark-spot", "sagemaker", "clairvoyant")
    results = await compare(w, _slow_model(), [POLICIES[n] for n in names], cfg, forecaster=None)
    for r in results:
        assert r.bound is not None
        b = r.bound_own if r.missed > r.bound.miss_budget else r.bound
        assert b is not None
        assert r.total_cost >= b.value * (1 - 1e-6) - 1e-9, (r.policy, r.total_cost, b)
