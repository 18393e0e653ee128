"""The serving engine on arrivals small enough to follow by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bouncer.latency import BatchLatency
from bouncer.miss_budget import MissBudget
from mark.catalog import load_catalog
from mark.sim.engine import DECLINED, FAILED, INSTANCE, LAMBDA, Engine, Server
from mark.sim.serverless import SimLambda


def _engine(arrivals: list[float], rt: float, *, bouncer: bool = True) -> tuple[Engine, SimLambda]:
    lam = SimLambda(load_catalog().lambda_prices, memory_mb=2048, cold_start_s=1.0)
    eng = Engine(np.array(arrivals), rt, lam, lambda k: 0.5 * k, bouncer=bouncer)
    return eng, lam


def test_one_instance_queues_what_it_can_finish_and_spills_the_rest() -> None:
    # T_1 = 100 ms, RT_max = 150 ms. Request 0 runs 0-0.1; request 1 (t=0.01) would
    # finish at 0.2 > 0.16: the Bouncer rejects it and Lambda answers after a cold
    # start (1 s) and its 0.5 s run. Request 2 at 0.3 finds the instance idle.
    eng, lam = _engine([0.0, 0.01, 0.3], 0.15)
    eng.set_servers([Server("i-1", "c5.large", "on-demand", "serving", BatchLatency(((1, 0.1),)))])
    eng.serve_until(10.0)
    assert eng.lat.tolist() == pytest.approx([0.1, 1.0 + 0.5, 0.1])  # spilled at once
    assert eng.where.tolist() == [INSTANCE, LAMBDA, INSTANCE]
    assert (lam.invocations, lam.cold_starts) == (1, 1)
    # 500 ms at 2 GB = 1 GB-s, plus one request.
    prices = load_catalog().lambda_prices
    assert lam.cost == pytest.approx(1.0 * prices.per_gb_second_x86 + prices.per_request)


def test_a_second_spill_reuses_the_warm_lambda() -> None:
    eng, lam = _engine([0.0, 0.01, 5.0, 5.01], 0.15)
    eng.set_servers([Server("i-1", "c5.large", "on-demand", "serving", BatchLatency(((1, 0.1),)))])
    eng.serve_until(10.0)
    assert eng.lat[3] == pytest.approx(0.5)  # warm: no cold start
    assert (lam.invocations, lam.cold_starts) == (2, 1)


def test_a_batch_fills_until_its_window_ends() -> None:
    # N_batch 4, W_batch 200 ms: three requests by t=0.2 go as one batch at 0.2;
    # T_3 = 0.1 + (0.3 - 0.1) * 2/3 on the curve through (1, 0.1) and (4, 0.3).
    curve = BatchLatency(((1, 0.1), (4, 0.3)))
    eng, _ = _engine([0.0, 0.05, 0.1, 1.0], 0.6)
    eng.set_servers([Server("i-1", "p2.xlarge", "on-demand", "serving", curve, 4, 0.2)])
    eng.serve_until(10.0)
    fin = 0.2 + 0.1 + 0.2 * 2 / 3
    assert eng.lat[:3].tolist() == pytest.approx([fin, fin - 0.05, fin - 0.1])
    assert eng.lat[3] == pytest.approx(0.2 + 0.1)  # alone: waits out its window


def test_without_a_bouncer_an_instance_queues_everything() -> None:
    eng, lam = _engine([0.0, 0.0, 0.0], 0.15, bouncer=False)
    eng.set_servers([Server("i-1", "c5.large", "on-demand", "serving", BatchLatency(((1, 0.1),)))])
    eng.serve_until(10.0)
    assert eng.lat.tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert lam.invocations == 0


def test_the_soonest_finishing_instance_takes_the_request() -> None:
    fast = Server("i-fast", "c5.xlarge", "on-demand", "serving", BatchLatency(((1, 0.05),)))
    slow = Server("i-slow", "c5.large", "on-demand", "serving", BatchLatency(((1, 0.2),)))
    eng, _ = _engine([0.0, 0.0, 0.0], 1.0)
    eng.set_servers([slow, fast])
    eng.serve_until(1.0)
    # fast finishes at 0.05, 0.10, then 0.15 still beats slow's 0.2.
    assert eng.lat.tolist() == pytest.approx([0.05, 0.10, 0.15])
    assert (fast.served, slow.served) == (3, 0)


def test_no_instance_and_no_lambda_fails_the_request() -> None:
    eng = Engine(np.array([0.0]), 0.1, None, lambda k: 1.0, bouncer=False)
    eng.serve_until(1.0)
    assert math.isinf(eng.lat[0]) and eng.where[0] == FAILED


def test_lambda_throttles_beyond_its_concurrency() -> None:
    lam = SimLambda(load_catalog().lambda_prices, concurrency=1, cold_start_s=0.0)
    assert lam.invoke(0.0, 1, 1.0) == pytest.approx(1.0)
    assert lam.invoke(0.5, 1, 1.0) is None
    assert lam.invoke(1.0, 1, 1.0) == pytest.approx(2.0)  # the first one is free again
    assert lam.throttled == 1


def test_a_burstable_standby_slows_to_its_baseline_when_credits_run_out() -> None:
    srv = Server(
        "i-t3",
        "t3.large",
        "on-demand",
        "standby",
        BatchLatency(((1, 0.3),)),
        burstable=True,
        vcpus=2,
        baseline=0.3,
        credits=0.01,  # 0.3 s on 2 vCPUs uses 0.01 credits: exactly one request
    )
    eng, _ = _engine([0.0, 1.0], 10.0)
    eng.set_servers([srv])
    eng.serve_until(5.0)
    assert eng.lat.tolist() == pytest.approx([0.3, 1.0])


def test_idle_instances_of_one_type_are_picked_by_id_as_the_dispatcher_does() -> None:
    curve = BatchLatency(((1, 0.1),))
    b = Server("i-b", "c5.large", "on-demand", "serving", curve)
    a = Server("i-a", "c5.large", "on-demand", "serving", curve)
    eng, _ = _engine([0.0, 0.5, 0.5], 1.0)
    eng.set_servers([b, a])
    eng.serve_until(1.0)
    # Both idle at 0 and again at 0.5: i-a first, then i-b takes the one i-a cannot.
    assert eng.lat.tolist() == pytest.approx([0.1, 0.1, 0.1])
    assert (a.served, b.served) == (2, 1)


def test_the_miss_budget_declines_what_would_spill_while_it_lasts() -> None:
    # 1,000 requests at once on one instance with RT_max 150 ms and T_1 = 100 ms: the
    # first runs, 999 would spill. SL_min 99 %, share 0.5: 5 misses of 1,000 may be
    # declined; the rest spill to Lambda, which answers in 0.5 s, past RT_max, so
    # those are misses too but nobody chose them.
    lam = SimLambda(load_catalog().lambda_prices, memory_mb=2048, cold_start_s=0.0)
    budget = MissBudget(sl_min=0.99, share=0.5)
    eng = Engine(np.zeros(1000), 0.15, lam, lambda k: 0.5 * k, budget=budget)
    eng.set_servers([Server("i-1", "c5.large", "on-demand", "serving", BatchLatency(((1, 0.1),)))])
    eng.serve_until(1.0)
    where = eng.where.tolist()
    assert where.count(DECLINED) == 5 and where.count(INSTANCE) == 1
    assert where.count(LAMBDA) == 994 and lam.invocations == 994
    assert np.isinf(eng.lat[eng.where == DECLINED]).all()
    assert budget.arrived == 1000 and budget.missed == 5 + 994


def test_late_answers_use_the_budget_before_anything_is_declined() -> None:
    # The Lambda answers of the first burst come 0.5 s late: 3 misses of 600 arrivals
    # spend the 3 the share allows, so the second burst's spill is not declined.
    lam = SimLambda(load_catalog().lambda_prices, memory_mb=2048, cold_start_s=0.0)
    budget = MissBudget(sl_min=0.99, share=0.5)
    arrivals = np.array([0.0] * 4 + [0.5] * 596 + [5.0, 5.0])
    eng = Engine(arrivals, 0.15, lam, lambda k: 0.5 * k, budget=budget)
    eng.set_servers([Server("i-1", "c5.large", "on-demand", "serving", BatchLatency(((1, 0.1),)))])
    eng.serve_until(0.2)  # the first 4: one served, 3 would spill, none yet counted
    assert eng.where[:4].tolist() == [INSTANCE, LAMBDA, LAMBDA, LAMBDA]
    eng.serve_until(10.0)
    assert (eng.where == DECLINED).sum() == 0
    assert (eng.where[600:] == LAMBDA).sum() == 1 and eng.where[600] == INSTANCE


def test_spill_goes_in_batches_the_function_finishes_by_the_deadlines() -> None:
    # No instance; six requests arrive together, RT_max 1 s, warm Lambda whose batch of 4
    # takes 0.3 s (of 1 alone 0.1 s). Unbatched: six invocations of 0.1 s. Batched: the
    # engine takes what waits (up to the 4 measured) into one invocation, then the rest.
    prices = load_catalog().lambda_prices
    curve = BatchLatency.from_mapping({1: 0.1, 2: 0.15, 4: 0.3})
    arrivals = [0.0] * 6
    runs = {}
    for batched in (False, True):
        lam = SimLambda(prices, memory_mb=1024, cold_start_s=0.0)
        eng = Engine(np.array(arrivals), 1.0, lam, curve, spill_batches=curve if batched else None)
        eng.set_servers([])
        eng.serve_until(10.0)
        assert eng.where.tolist() == [LAMBDA] * 6
        assert float(eng.lat.max()) <= 1.0
        runs[batched] = (lam.invocations, lam.requests, lam.cost, eng.lat.tolist())
    assert runs[False][:2] == (6, 6)
    assert runs[True][:2] == (2, 6)  # a batch of 4, then the 2 left
    assert runs[True][3] == pytest.approx([0.3] * 4 + [0.15] * 2)
    # Billed per invocation: 0.3 + 0.15 GB-s and two fees, against 0.6 GB-s and six.
    assert runs[True][2] == pytest.approx(0.45 * prices.per_gb_second_x86 + 2 * prices.per_request)
    assert runs[False][2] == pytest.approx(0.6 * prices.per_gb_second_x86 + 6 * prices.per_request)


def test_variants_take_a_burst_on_the_faster_one_within_the_floor() -> None:
    # The dispatcher's rule on virtual time: RT_max 0.5 s; the accurate variant takes 0.3 s
    # a request, the fast one 0.03 s. Ten requests a second apart fill the window at 0.8;
    # then four at once: the first on the accurate one, the next three on the fast one
    # (the accurate one would end them at 0.6 s and later), none spilled.
    from bouncer.variants import Variant

    large = BatchLatency.from_mapping({1: 0.3})
    small = BatchLatency.from_mapping({1: 0.03})
    arrivals = [float(t) for t in range(10)] + [20.0] * 4
    lam = SimLambda(load_catalog().lambda_prices, memory_mb=2048, cold_start_s=0.0)
    eng = Engine(np.array(arrivals), 0.5, lam, lambda k: 0.5 * k, accuracy_floor=0.75)
    variants = (Variant("large", 0.8, large), Variant("small", 0.7, small))
    eng.set_servers([Server("i-1", "c5.large", "on-demand", "serving", large, variants=variants)])
    eng.serve_until(30.0)
    assert eng.where.tolist() == [INSTANCE] * 14
    assert eng.acc.tolist() == [0.8] * 11 + [0.7] * 3
    assert eng.lat[10:].tolist() == pytest.approx([0.3, 0.33, 0.36, 0.39])
    assert eng.ledger.delivered(30.0) == pytest.approx((11 * 0.8 + 3 * 0.7) / 14)
    # With the floor at the accurate one's accuracy, the three spill instead.
    strict = Engine(np.array(arrivals), 0.5, lam, lambda k: 0.1 * k, accuracy_floor=0.8)
    strict.set_servers(
        [Server("i-1", "c5.large", "on-demand", "serving", large, variants=variants)]
    )
    strict.serve_until(30.0)
    assert strict.where.tolist() == [INSTANCE] * 11 + [LAMBDA] * 3
    assert strict.acc.tolist() == [0.8] * 14  # Lambda runs the accurate one
