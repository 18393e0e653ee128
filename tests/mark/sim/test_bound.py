"""The whole-system lower bound (``mark.sim.bound``): hand-computed optima on tiny
traces, exact pruning, and no simulated policy ever below it."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from bouncer.latency import BatchLatency
from mark.catalog import load_catalog
from mark.sim.bound import (
    THETA_STEP,
    BoundError,
    BoundOffering,
    LambdaTerms,
    _cover_seconds,
    batch_floor,
    bound_offerings,
    lambda_terms,
    miss_budget,
    per_request_floor,
    presence_floor,
    prune_dominated,
    request_prices,
    slo_rate,
    slot_counts,
    system_bound,
    window_bound,
)
from mark.sim.compare import compare
from mark.sim.models import SimModel, paper_model
from mark.sim.policies import POLICIES, parse_policies
from mark.sim.run import SimConfig
from mark.sim.workloads import Workload

RT = 0.6
KAPPA = 1.0 + RT / 60.0  # a batch may run up to RT_max past a run's end (module doc)
SLOT = 5.0
ONE = BoundOffering("c5.large", "on-demand", 0.36, 10.0)  # 10 r/s, $0.36/h = $0.0001/s
LAMBDA = LambdaTerms(latency_s=0.4, cost_per_request=2e-5, concurrency=1000)


def _bound(counts: list[float] | np.ndarray, **kw: object) -> float:
    args: dict[str, object] = {
        "rt_max_s": RT,
        "miss_budget": 0,
        "lam": None,
        "slot_s": SLOT,
        "offerings": [ONE],
    }
    args.update(kw)
    return system_bound(np.asarray(counts), **args).value  # type: ignore[arg-type]


def test_constant_load_needing_two_and_a_half_instances_costs_two_and_a_half() -> None:
    """25 r/s for 10 minutes on 10 r/s instances: 2.5 instances the whole time (the LP
    relaxation), 2.5 × price × duration (÷ κ: batches may end RT_max after a run)."""
    seconds = 600
    counts = np.full(int(seconds / SLOT), 25.0 * SLOT)
    want = 2.5 * ONE.price_per_hour * seconds / 3600.0 / KAPPA
    assert _bound(counts) == pytest.approx(want, rel=1e-6)
    # With one-minute slots the same.
    assert _bound(np.full(10, 25.0 * 60), slot_s=60.0) == pytest.approx(want, rel=1e-6)


def test_a_lone_spike_goes_to_lambda_when_a_billed_minute_costs_more() -> None:
    """100 requests in one 5 s slot and nothing else. An instance started for them is
    billed 60 s and can work on them for at most two slots (10 s, RT_max 0.6 s), so per
    request it costs at least 60 × $0.0001 / (10 s × 10 r/s) = $6e-5 > Lambda's $2e-5."""
    counts = np.zeros(24)
    counts[5] = 100
    assert _bound(counts, lam=LAMBDA) == pytest.approx(100 * LAMBDA.cost_per_request, rel=1e-6)
    # Without Lambda the instance is the only way: one start, a billed minute.
    no_lambda = _bound(counts)
    assert no_lambda == pytest.approx(ONE.price_per_hour * 60 / 3600 / KAPPA, rel=1e-6)
    assert no_lambda > 100 * LAMBDA.cost_per_request


def test_lambda_carries_a_tiny_load_cheaper_than_a_slow_instance() -> None:
    """An instance at $1.8/h that serves 1 r/s costs $5e-4 a request; Lambda $2e-5."""
    slow = BoundOffering("x", "on-demand", 1.8, 1.0)
    counts = np.full(60, 2.0)
    value = _bound(counts, offerings=[slow], lam=LAMBDA)
    assert value == pytest.approx(120 * LAMBDA.cost_per_request, rel=1e-6)


def test_lambda_too_slow_for_rt_max_is_no_help() -> None:
    slow_lambda = LambdaTerms(latency_s=0.7, cost_per_request=1e-9, concurrency=1000)
    counts = np.full(60, 50.0)
    assert _bound(counts, lam=slow_lambda) == pytest.approx(_bound(counts), rel=1e-9)


def test_lambda_concurrency_limits_what_it_takes() -> None:
    """One environment, 0.4 s a request: at most 12.5 a slot (over the 120 slots and the
    one after the window, RT_max into which the last slot's requests may be served)."""
    one_env = LambdaTerms(latency_s=0.4, cost_per_request=0.0, concurrency=1)
    counts = np.full(120, 50.0)  # 10 r/s
    on_instances = counts.sum() - 12.5 * 121
    want = on_instances / ONE.rate_rps * ONE.price_per_hour / 3600 / KAPPA
    assert _bound(counts, lam=one_env) == pytest.approx(want, rel=1e-6)


def test_the_miss_budget_removes_a_spike() -> None:
    """A steady 10 r/s (one instance for 600 s) plus 50 requests at once: with 50 misses
    allowed the spike costs nothing. Without, it needs 5 more instance-seconds in its two
    slots, and only those: the instance started for it takes over from the running one,
    which has run past its billed minute (a real schedule can do the same swap)."""
    counts = np.full(120, 50.0)
    counts[60] += 50
    steady = ONE.price_per_hour * 600 / 3600 / KAPPA
    assert _bound(counts, miss_budget=50) == pytest.approx(steady, rel=1e-6)
    assert _bound(counts, miss_budget=0) == pytest.approx(steady * 605 / 600, rel=1e-6)
    # The budget goes where it saves most: 25 misses leave half the spike.
    assert _bound(counts, miss_budget=25) == pytest.approx(steady * 602.5 / 600, rel=1e-6)


def test_the_miss_budget_is_the_slo_share_of_all_requests() -> None:
    assert miss_budget(10_000, 0.98) == 200
    assert miss_budget(99, 0.98) == 1
    assert miss_budget(0, 0.98) == 0


def test_billing_minimum_makes_short_bursts_dear() -> None:
    """100 requests in one 5 s slot (20 r/s) every two minutes, nothing between: each
    burst needs one instance over its two slots (10 instance-seconds of work), and an
    instance started for it is billed a minute. Keeping it to the next burst costs more
    (130 s for two), so: five bursts, five billed minutes."""
    price_s = ONE.price_per_hour / 3600 / KAPPA
    counts = np.zeros(120)
    counts[::24] = 100
    assert _bound(counts) == pytest.approx(5 * 60 * price_s, rel=1e-6)
    # The work alone is a sixth of that: the 60 s minimum is what the bound charges.
    assert _bound(counts) == pytest.approx(6 * 5 * 100 / ONE.rate_rps * price_s, rel=1e-6)
    # A burst every minute: one instance kept 70 s serves two bursts (0 s and 60 s).
    counts = np.zeros(120)
    counts[::12] = 100
    assert _bound(counts) == pytest.approx(5 * 70 * price_s, rel=1e-6)


# -- the batching floor (module doc, item 6) -----------------------------------

FLAT = BatchLatency(((1, 0.25), (8, 0.25), (9, 0.7)))  # 0.25 s up to 8, then past RT_max


def _flat(price: float = 0.36) -> BoundOffering:
    return BoundOffering("c5.large", "on-demand", price, slo_rate(FLAT, RT), latency=FLAT)


def test_the_floor_per_request_is_the_batch_time_over_the_most_that_can_share_it() -> None:
    gaps, theta = per_request_floor(_flat(), RT)
    assert gaps == pytest.approx([RT - 0.25] * 8)  # k in-time requests: ≤ 0.35 s apart
    assert theta == pytest.approx([0.25 / k for k in range(1, 9)])
    # A slower batch past RT_max is out; T_n that falls with n counts at the larger n's time.
    odd = BatchLatency(((1, 0.3), (2, 0.2), (3, 0.5), (4, 0.7)))
    gaps, theta = per_request_floor(BoundOffering("x", "on-demand", 1.0, 1.0, latency=odd), RT)
    assert gaps == pytest.approx([RT - 0.2, RT - 0.2, RT - 0.5])  # T̃ = 0.2, 0.2, 0.5
    # T̃_1 = min(T_1, T_2) = 0.2; with up to 3 sharing, 2 of them in a 0.2 s batch is least.
    assert theta == pytest.approx([0.2, 0.1, 0.1])
    assert theta.size == 3  # T_4 = 0.7 > RT_max


def _window(arrivals: np.ndarray, t0: float, seconds: float) -> np.ndarray:
    return arrivals[(arrivals >= t0) & (arrivals < t0 + seconds)]


def test_sparse_arrivals_pay_a_whole_batch_each() -> None:
    """One request every 2 s: no two within 0.35 s, so each holds a 0.25 s batch alone,
    8x the instance time of a full batch's share; the bound is 8x the rate-only one."""
    t0, seconds = 1_000.0, 600.0
    arrivals = t0 + np.arange(0.0, seconds, 2.0)
    counts = slot_counts(arrivals, t0, seconds, SLOT)
    assert request_prices(arrivals, t0, seconds, [_flat()], RT) == pytest.approx(
        np.full(arrivals.size, 0.36 / 3600 * 0.25)
    )
    floor = batch_floor(arrivals, t0, seconds, SLOT, [_flat()], RT)
    rate_only = _bound(counts, offerings=[_flat()])
    assert _bound(counts, offerings=[_flat()], batch_floor=floor) == pytest.approx(
        8 * rate_only, rel=1e-6
    )
    # Three arrivals 0.1 s apart every 2 s can share one batch: a third of it each.
    bunched = np.sort(np.concatenate([arrivals, arrivals + 0.1, arrivals + 0.2]))
    assert request_prices(bunched, t0, seconds, [_flat()], RT) == pytest.approx(
        np.full(_window(bunched, t0, seconds).size, 0.36 / 3600 * 0.25 / 3)
    )


def test_the_requests_a_batch_shares_must_all_fit_its_own_window() -> None:
    """T_1..3 = 0.3 s, T_4 = 0.55 s, RT_max 0.6: three requests may share a batch only if
    they arrived within 0.3 s of one another. Arrivals 0.2 s apart: any two can, no three
    can, so each pays half a batch, 0.15 s, though three lie within 0.3 s either side of
    the middle one (0.1 s each if counted so). Four within 0.05 s may share a batch: the least
    per request is then three in 0.3 s, 0.1 s (four in 0.55 s is 0.1375 s)."""
    curve = BatchLatency(((1, 0.3), (3, 0.3), (4, 0.55)))
    o = BoundOffering("c5.large", "on-demand", 3.6, slo_rate(curve, RT), latency=curve)
    t0 = 100.0
    arrivals = t0 + np.arange(0.0, 10.0, 0.2)
    per_s = 3.6 / 3600
    got = request_prices(arrivals, t0, 10.0, [o], RT)
    assert got == pytest.approx(np.full(arrivals.size, per_s * 0.15))
    four = t0 + np.array([0.0, 0.01, 0.02, 0.05, 5.0])
    got = request_prices(four, t0, 10.0, [o], RT)
    assert got == pytest.approx(per_s * np.array([0.1] * 4 + [0.3]))


def _prices_by_definition(arrivals: np.ndarray, o: BoundOffering) -> np.ndarray:
    """π_r straight from the module doc: the largest k such that some window of
    RT_max − T̃_k starting at an arrival holds r and at least k arrivals."""
    gaps, theta = per_request_floor(o, RT)
    out = []
    for r in arrivals:
        best_k = 1
        for k in range(2, theta.size + 1):
            g = gaps[k - 1]
            starts = arrivals[(arrivals <= r) & (arrivals >= r - g - 1e-9)]
            if any(
                np.count_nonzero((arrivals >= s) & (arrivals <= s + g + 1e-9)) >= k for s in starts
            ):
                best_k = k
        out.append(theta[best_k - 1] * o.price_per_hour / 3600)
    return np.asarray(out)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    gaps=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=40),
    times=st.lists(st.floats(0.05, 0.6), min_size=1, max_size=8).map(sorted),
)
def test_request_prices_follow_their_definition(gaps: list[float], times: list[float]) -> None:
    """Any profile (``T_n`` nondecreasing) and any arrivals: the cumulative counts of
    ``request_prices`` agree with counting the windows one by one."""
    curve = BatchLatency(tuple(enumerate(times, 1)))
    o = BoundOffering("x", "on-demand", 3.6, max(slo_rate(curve, RT), 1e-9), latency=curve)
    if per_request_floor(o, RT)[1].size == 0:
        return
    arrivals = 10.0 + np.cumsum(np.asarray(gaps))
    got = request_prices(arrivals, 0.0, 100.0, [o], RT)
    want = _prices_by_definition(arrivals, o)
    # request_prices reads θ at the end of a run of falls below THETA_STEP: never above.
    assert np.all(got <= want * (1 + 1e-12))
    assert np.all(got >= want * (1 - THETA_STEP) ** 8)


def test_dense_arrivals_fill_batches_and_the_floor_adds_nothing() -> None:
    t0, seconds = 1_000.0, 300.0
    arrivals = t0 + np.arange(0.0, seconds, 0.02)  # 50 r/s: 17 within 0.35 s of each
    counts = slot_counts(arrivals, t0, seconds, SLOT)
    prices = request_prices(arrivals, t0, seconds, [_flat()], RT)
    assert np.allclose(prices, 0.36 / 3600 * 0.25 / 8)  # a full batch's share: 1/μ
    floor = batch_floor(arrivals, t0, seconds, SLOT, [_flat()], RT)
    assert floor.slot.tolist() == list(range(counts.size))  # one group per slot
    with_floor = _bound(counts, offerings=[_flat()], batch_floor=floor)
    assert with_floor == pytest.approx(_bound(counts, offerings=[_flat()]), rel=1e-6)


def test_a_lone_request_beside_a_full_batch_pays_its_own_and_is_the_one_missed() -> None:
    """Each 5 s slot holds a burst of 16 requests within 0.1 s (two full batches) and one
    request 2 s later, alone. The lone one pays a whole 0.25 s batch, which a price per
    slot (the burst's) would not charge; with a budget of one miss per slot the LP misses
    exactly the lone ones and costs what the bursts alone cost."""
    t0, seconds = 1_000.0, 300.0
    starts = t0 + np.arange(0.0, seconds, SLOT)
    burst = np.sort((starts[:, None] + np.linspace(0.0, 0.1, 16)[None, :]).ravel())
    both = np.sort(np.concatenate([burst, starts + 2.0]))
    groups = batch_floor(both, t0, seconds, SLOT, [_flat()], RT)
    assert groups.count.tolist() == [16, 1] * starts.size
    assert groups.price[1] == pytest.approx(0.36 / 3600 * 0.25)  # alone
    floor_of = {"offerings": [_flat()], "batch_floor": groups}
    only_bursts = _bound(
        slot_counts(burst, t0, seconds, SLOT),
        offerings=[_flat()],
        batch_floor=batch_floor(burst, t0, seconds, SLOT, [_flat()], RT),
    )
    counts = slot_counts(both, t0, seconds, SLOT)
    assert _bound(counts, miss_budget=starts.size, **floor_of) == pytest.approx(
        only_bursts, rel=1e-6
    )
    # Served, each lone request adds at least its whole batch: 0.25 s of an instance.
    lone_s = starts.size * 0.25 * 0.36 / 3600 / KAPPA
    assert _bound(counts, **floor_of) >= only_bursts + lone_s * (1 - 1e-6)


def test_the_floor_takes_the_cheapest_offering_per_request_and_pruning_keeps_the_value() -> None:
    """A second offering at half the price but 0.4 s batches (20 r/s full): per request
    alone it costs 0.18 × 0.4 < 0.36 × 0.25, so π uses it; pruning to the best price
    per full-batch rate (the first) must not change the bound."""
    slow = BatchLatency(((1, 0.4), (8, 0.4), (9, 0.7)))
    half = BoundOffering("c5.xlarge", "on-demand", 0.18, slo_rate(slow, RT), latency=slow)
    t0, seconds = 1_000.0, 600.0
    arrivals = t0 + np.arange(0.0, seconds, 2.0)
    counts = slot_counts(arrivals, t0, seconds, SLOT)
    prices = request_prices(arrivals, t0, seconds, [_flat(), half], RT)
    assert prices == pytest.approx(np.full(arrivals.size, 0.18 / 3600 * 0.4))
    floor = batch_floor(arrivals, t0, seconds, SLOT, [_flat(), half], RT)
    both = {"offerings": [_flat(), half], "batch_floor": floor}
    assert _bound(counts, **both) == pytest.approx(_bound(counts, **both, prune=False), rel=1e-6)


def test_groups_that_do_not_hold_the_slots_requests_are_refused() -> None:
    t0, seconds = 1_000.0, 20.0
    arrivals = t0 + np.arange(0.0, seconds, 2.0)
    floor = batch_floor(arrivals, t0, seconds, SLOT, [_flat()], RT)
    counts = slot_counts(arrivals, t0, seconds, SLOT)
    counts[0] += 1
    with pytest.raises(BoundError, match="groups"):
        _bound(counts, offerings=[_flat()], batch_floor=floor)


async def test_no_policy_costs_less_than_the_bound_where_the_floor_binds() -> None:
    """Sparse load on a model whose batches only pay when full: the floor raises the
    bound well above the rate-only one, and still no simulated policy is below it."""
    model = SimModel(
        name="batchy",
        rt_max_s=0.6,
        sl_min=0.98,
        latency={"c5.xlarge": BatchLatency(((1, 0.25), (8, 0.3)))},
        lambda_t1_s=0.9,  # too slow for RT_max: instances must answer
        standby_t1_s=0.2,
    )
    seconds = 900
    per_second = np.full(HISTORY_S + seconds, 1.5)
    w = Workload("sparse", per_second, EPOCH, HISTORY_S, seconds)
    cfg = SimConfig(warmup_s=300, seed=4, boot_s=60, milp_time_limit_s=5)
    names = ("mark", "sagemaker", "ec2-target-tracking", "clairvoyant")
    results = await compare(w, model, [POLICIES[n] for n in names], cfg, forecaster=None)
    arrivals = w.arrivals(int(w.start - cfg.warmup_s), w.end, cfg.seed)
    counts = slot_counts(arrivals, w.t0, seconds, SLOT)
    offerings = bound_offerings(model, load_catalog(), ["on-demand"])
    rate_only = system_bound(
        counts,
        offerings,
        rt_max_s=model.rt_max_s,
        miss_budget=miss_budget(int(counts.sum()), model.sl_min),
        lam=None,
    ).value
    for r in results:
        assert r.bound is not None
        floor = (r.bound_own or r.bound).value
        assert r.bound.value > 3 * rate_only  # 1.5 r/s: most requests alone in a batch
        assert r.total_cost >= floor * (1 - 1e-6) - 1e-9, (r.policy, r.total_cost, floor)


def test_slot_must_divide_a_minute_and_rt_max_be_below_one() -> None:
    with pytest.raises(BoundError, match="divide"):
        _bound([1.0], slot_s=7.0)
    with pytest.raises(BoundError, match="RT_max"):
        _bound([1.0], rt_max_s=61.0)


def test_no_offering_and_no_budget_is_infeasible() -> None:
    b = system_bound(np.array([5.0]), [], rt_max_s=RT, miss_budget=0, lam=None)
    assert b.status == "infeasible" and math.isinf(b.value)
    assert b.summary()["value"] is None
    assert b.summary()["set_by"] == "lp"


# -- pruning -------------------------------------------------------------------


def test_pruning_keeps_the_least_price_per_rate_and_drops_the_dominated() -> None:
    cheap = BoundOffering("a", "spot", 0.1, 5.0)
    dominated = BoundOffering("b", "on-demand", 0.2, 4.0)  # dearer and slower than a
    fast = BoundOffering("c", "on-demand", 1.0, 40.0)  # faster, dearer per rate than a
    assert prune_dominated([cheap, dominated, fast]) == [cheap]
    twin = BoundOffering("d", "spot", 0.2, 10.0)  # the same price per rate as a
    assert prune_dominated([cheap, twin]) == [cheap, twin]


@pytest.mark.parametrize("seed", range(4))
def test_pruning_never_changes_the_value(seed: int) -> None:
    rng = np.random.default_rng(seed)
    offerings = [
        BoundOffering(
            f"t{i}", "on-demand", float(rng.uniform(0.05, 1.0)), float(rng.uniform(1, 30))
        )
        for i in range(4)
    ]
    counts = rng.poisson(rng.uniform(0, 150, size=48)).astype(float)
    counts[rng.integers(0, 48, size=3)] += rng.integers(50, 400, size=3)
    kw: dict[str, object] = {"offerings": offerings, "lam": LAMBDA, "miss_budget": 30}
    pruned = _bound(counts, prune=True, **kw)
    full = _bound(counts, prune=False, **kw)
    assert pruned == pytest.approx(full, rel=1e-6)


# -- inputs from the simulator's model ----------------------------------------


def test_rates_come_from_the_best_batch_within_rt_max() -> None:
    """T_b = 0.1 + 0.05 b: 4 r/s one at a time, b = 10 takes 0.6 s → 16.7 r/s."""
    curve = BatchLatency(((1, 0.15), (10, 0.6)))
    assert slo_rate(curve, 0.6) == pytest.approx(10 / 0.6)
    assert slo_rate(curve, 0.1) == 0.0  # not even one request fits
    assert slo_rate(curve, 0.6, max_batch=1) == pytest.approx(1 / 0.15)


def test_offerings_and_lambda_of_a_paper_model() -> None:
    model, cat = paper_model("inception-v3"), load_catalog()
    od = bound_offerings(model, cat, ["on-demand"])
    assert {o.market for o in od} == {"on-demand"}
    best = prune_dominated(od)
    # P2 (the paper's cheapest per request) is retiring: C5 alone, c5.large cheapest.
    assert [o.key for o in best] == ["c5.large/on-demand"]  # 284 a minute, $0.085/h
    assert best[0].rate_rps == pytest.approx(284 / 60)
    spot = bound_offerings(model, cat, ["on-demand", "spot"], ["t3.large"])
    assert any(o.role == "standby" for o in spot)
    assert [o.key for o in prune_dominated(spot)] == ["c5.large/spot"]
    lam = lambda_terms(model, cat, 3072, 1000)
    prices = cat.lambda_prices
    assert lam.cost_per_request == pytest.approx(
        0.38 * 3 * prices.per_gb_second_x86 + prices.per_request
    )


def test_slot_counts_cover_the_window_only() -> None:
    arr = np.array([99.0, 100.0, 104.9, 105.0, 119.99, 120.0])
    assert slot_counts(arr, 100.0, 20.0, 5.0).tolist() == [2, 1, 0, 1]


# -- the former name -------------------------------------------------------------


def test_optimal_is_an_alias_of_clairvoyant_with_a_note() -> None:
    notes: list[str] = []
    got = parse_policies("mark,optimal,optimal-spot,clairvoyant", note=notes.append)
    assert [p.name for p in got] == ["mark", "clairvoyant", "clairvoyant-spot"]
    assert len(notes) == 2 and "'optimal' is now 'clairvoyant'" in notes[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [p.name for p in parse_policies("optimal")] == ["clairvoyant"]
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)


# -- every simulated policy pays at least the bound ------------------------------

EPOCH = 1_700_000_000.0
HISTORY_S = 2 * 3600


def _tiny_model(lambda_t1_s: float = 0.4, lambda_batches: BatchLatency | None = None) -> SimModel:
    return SimModel(
        name="tiny",
        rt_max_s=0.6,
        sl_min=0.98,
        latency={
            "c5.large": BatchLatency(((1, 0.2),)),
            "c5.xlarge": BatchLatency(((1, 0.1), (4, 0.25))),
        },
        lambda_t1_s=lambda_t1_s,
        lambda_batches=lambda_batches,
        standby_t1_s=0.2,
    )


@st.composite
def _loads(draw: st.DrawFn) -> np.ndarray:
    """A few minutes of piecewise-constant load with the odd burst."""
    piece = st.tuples(st.integers(30, 240), st.floats(0.0, 40.0))
    pieces = draw(st.lists(piece, min_size=1, max_size=4))
    rates = np.concatenate([np.full(d, r) for d, r in pieces])
    burst = st.tuples(st.integers(0, 600), st.integers(1, 20), st.floats(10.0, 120.0))
    for at, d, r in draw(st.lists(burst, max_size=2)):
        rates[at : at + d] += r
    return rates


@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(load=_loads(), seed=st.integers(0, 100))
async def test_no_simulated_policy_costs_less_than_the_bound(load: np.ndarray, seed: int) -> None:
    await _no_policy_below_the_bound(load, seed, _tiny_model())


# A spill function that answers a batch of 4 in 0.55 s (1.4 T_1): the runs spill in batches.
BATCHED_LAMBDA = BatchLatency.from_mapping({1: 0.4, 2: 0.45, 4: 0.55})


@settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(load=_loads(), seed=st.integers(0, 100))
async def test_no_policy_spilling_in_batches_costs_less_than_the_bound(
    load: np.ndarray, seed: int
) -> None:
    await _no_policy_below_the_bound(load, seed, _tiny_model(lambda_batches=BATCHED_LAMBDA))


def test_the_bound_prices_lambda_at_its_cheapest_batch_within_rt_max() -> None:
    cat = load_catalog()
    prices = cat.lambda_prices
    gb = 2.0 * prices.per_gb_second_x86
    lam = lambda_terms(_tiny_model(lambda_batches=BATCHED_LAMBDA), cat, 2048, 10)
    # Within RT_max 0.6 s every size up to 4 runs; 4 is cheapest per request and fastest.
    assert lam.cost_per_request == pytest.approx((0.55 * gb + prices.per_request) / 4)
    assert lam.rate_per_env == pytest.approx(4 / 0.55)
    alone = lambda_terms(_tiny_model(), cat, 2048, 10)
    assert alone.cost_per_request == pytest.approx(0.4 * gb + prices.per_request)
    assert alone.rate_per_env == pytest.approx(1 / 0.4)


async def _no_policy_below_the_bound(load: np.ndarray, seed: int, model: SimModel) -> None:
    seconds = int(load.size)
    per_second = np.concatenate([np.full(HISTORY_S, max(float(load[0]), 1.0)), load])
    w = Workload("random", per_second, EPOCH, HISTORY_S, seconds)
    cfg = SimConfig(warmup_s=300, seed=seed, boot_s=60, milp_time_limit_s=5)
    names = ("mark", "mark-spot", "sagemaker", "clairvoyant")
    results = await compare(w, model, [POLICIES[n] for n in names], cfg, forecaster=None)
    for r in results:
        assert r.bound is not None
        if r.missed > r.bound.miss_budget:
            assert r.bound_own is not None
            floor = r.bound_own.value
        else:
            assert r.bound_own is None
            floor = r.bound.value
        assert r.total_cost >= floor * (1 - 1e-6) - 1e-9, (r.policy, r.total_cost, floor)
    # One bound per set of offerings, shared: mark, sagemaker and clairvoyant buy on-demand.
    by_name = {r.policy: r for r in results}
    assert by_name["mark"].bound is by_name["sagemaker"].bound is by_name["clairvoyant"].bound
    assert by_name["mark-spot"].bound is not by_name["mark"].bound


# -- the presence floor (Lambda too slow for RT_max) -------------------------------

SLOW_LAMBDA = LambdaTerms(latency_s=1.0, cost_per_request=2e-5, concurrency=1000)
PHI = 60.0 / (60.0 + RT)


def _floor(times: list[float], budget: int, lam: LambdaTerms | None = SLOW_LAMBDA) -> float:
    return presence_floor(
        np.asarray(times),
        [ONE],
        t0=0.0,
        seconds=10_000.0,
        rt_max_s=RT,
        miss_budget=budget,
        lam=lam,
    )


def test_two_requests_far_apart_pay_a_billed_minute_each() -> None:
    """1,000 s apart: two runs of 60 s beat one of ~1,000 s; with one miss allowed, one."""
    per_s = ONE.price_per_hour / 3600.0
    assert _floor([100.0, 1100.0], 0) == pytest.approx(120 * per_s)
    assert _floor([100.0, 1100.0], 1) == pytest.approx(60 * per_s)
    assert _floor([100.0, 1100.0], 2) == pytest.approx(0.0, abs=1e-12)


def test_a_request_every_half_minute_pays_a_billed_minute_per_three() -> None:
    """A request every 30 s for an hour: a run billed its one minute answers three (at
    0, 30 and 60 s of it), and the next 30 s need no instance. 40 such runs (2,400 s)
    beat one run through the hour (φ·3,570 s) and runs of four (φ·90 s per 120 s)."""
    times = [30.0 * i for i in range(120)]
    assert _floor(times, 0) == pytest.approx(40 * 60 * ONE.price_per_hour / 3600.0)
    assert _floor(times, 0) < PHI * 3570 * ONE.price_per_hour / 3600.0


def test_no_floor_where_lambda_answers_in_time() -> None:
    assert _floor([100.0, 1100.0], 0, lam=LAMBDA) == 0.0
    assert _floor([100.0, 1100.0], 0, lam=None) > 0.0


def _brute_cover(times: list[float], weight: float) -> float:
    """Every way to split the requests into skipped ones and runs of consecutive ones."""
    best = math.inf
    n = len(times)

    def go(i: int, acc: float) -> None:
        nonlocal best
        if i == n:
            best = min(best, acc)
            return
        go(i + 1, acc + weight)
        for k in range(i, n):
            go(k + 1, acc + max(60.0, PHI * (times[k] - times[i])))

    go(0, 0.0)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_the_programme_is_exact_and_the_floor_below_the_best_cover(seed: int) -> None:
    rng = np.random.default_rng(seed)
    times = sorted(rng.uniform(0, 400, 8).tolist())
    for weight in (0.0, 7.0, 30.0, 60.0):
        assert _cover_seconds(times, weight, PHI) == pytest.approx(_brute_cover(times, weight))
    per_s = ONE.price_per_hour / 3600.0
    for budget in range(3):
        # The constrained optimum by brute force: the cheapest cover missing ≤ budget.
        best = math.inf
        for mask in range(1 << len(times)):
            kept = [t for b, t in enumerate(times) if mask >> b & 1]
            if len(times) - len(kept) <= budget:
                best = min(best, _brute_cover(kept, math.inf) if kept else 0.0)
        got = _floor(times, budget)
        assert got <= best * per_s + 1e-12
        if budget == 0:
            assert got == pytest.approx(best * per_s)  # λ = 60 s per request is exact


def test_the_bound_is_the_larger_of_the_lp_and_the_floor() -> None:
    """OpenNMT-ende (Lambda 3.1 s, RT_max 1.4 s) at 0.05 r/s for an hour: the LP charges
    a sliver of an instance, the floor one instance most of the hour."""
    model = paper_model("opennmt-ende")
    catalog = load_catalog()
    rng = np.random.default_rng(3)
    arrivals = np.sort(rng.uniform(0, 3600, 180))
    b = window_bound(model, catalog, arrivals, t0=0.0, seconds=3600.0, markets=["on-demand"])
    cheapest = min(o.price_per_hour for o in bound_offerings(model, catalog, ["on-demand"]))
    assert b.lp_value is not None and b.lp_value < b.presence_floor
    assert b.floor_binds and b.value == b.presence_floor == b.instance_cost
    assert b.summary()["set_by"] == "presence_floor"
    assert 0.5 * cheapest < b.value <= cheapest * (3600 + 60) / 3600


@st.composite
def _sparse_loads(draw: st.DrawFn) -> np.ndarray:
    """A few minutes of a load of a few requests per second, with quiet spells."""
    piece = st.tuples(st.integers(30, 240), st.sampled_from([0.0, 0.05, 0.3, 1.0, 3.0]))
    return np.concatenate([np.full(d, r) for d, r in draw(st.lists(piece, min_size=1, max_size=5))])


@settings(
    max_examples=5,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(load=_sparse_loads(), seed=st.integers(0, 100))
async def test_where_lambda_is_too_slow_no_policy_costs_less_than_the_floor(
    load: np.ndarray, seed: int
) -> None:
    """Lambda at 1 s against RT_max 0.6 s: only instances answer in time, and the bound
    (the larger of the LP and the presence floor) still holds for every simulated run."""
    seconds = int(load.size)
    per_second = np.concatenate([np.full(HISTORY_S, max(float(load[0]), 0.1)), load])
    w = Workload("sparse", per_second, EPOCH, HISTORY_S, seconds)
    cfg = SimConfig(warmup_s=300, seed=seed, boot_s=60, milp_time_limit_s=5)
    names = ("mark", "mark-spot", "clairvoyant")
    model = _tiny_model(lambda_t1_s=1.0)
    results = await compare(w, model, [POLICIES[n] for n in names], cfg, forecaster=None)
    for r in results:
        assert r.bound is not None
        b = r.bound_own if r.missed > r.bound.miss_budget else r.bound
        assert b is not None
        assert b.lp_value is not None and b.value >= b.lp_value
        assert r.total_cost >= b.value * (1 - 1e-6) - 1e-9, (r.policy, r.total_cost, b)


def test_the_simplex_decides_where_the_interior_point_stops_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The floor's LP goes to HiGHS's interior point; stopped after one iteration (its
    real iteration limit), the bound comes from the dual simplex, the same value."""
    import mark.sim.bound as bound_mod

    t0, seconds = 1_000.0, 300.0
    arrivals = t0 + np.arange(0.0, seconds, 2.0)
    counts = slot_counts(arrivals, t0, seconds, SLOT)
    floor = batch_floor(arrivals, t0, seconds, SLOT, [_flat()], RT)
    want = _bound(counts, offerings=[_flat()], batch_floor=floor)
    methods: list[tuple[str, int]] = []

    def stopped(*args: object, method: str = "highs", **kw: object) -> object:
        if method == "highs-ipm":
            kw["options"] = {"maxiter": 1}
        res = linprog(*args, method=method, **kw)
        methods.append((method, res.status))
        return res

    monkeypatch.setattr(bound_mod, "linprog", stopped)
    assert _bound(counts, offerings=[_flat()], batch_floor=floor) == pytest.approx(want, rel=1e-9)
    assert methods == [("highs-ipm", 1), ("highs", 0)]
