"""The instance model against a seeded discrete-event queue."""

import math

import numpy as np
import pytest

from provisioner.perf_model import (
    InstancePerf,
    capacity_under_slo,
    erlang_c,
    mdc_mean_wait,
    poisson_arrivals,
    simulate_queue,
    tail_latency,
)


def test_throughput_counts_workers_and_batch() -> None:
    assert InstancePerf(batch_time_s=0.2).throughput == pytest.approx(5.0)
    assert InstancePerf(batch_time_s=0.2, servers=3).throughput == pytest.approx(15.0)
    assert InstancePerf(batch_time_s=0.1446, batch_size=8).throughput == pytest.approx(55.33, 1e-3)


def test_md1_matches_pollaczek_khinchine() -> None:
    # M/D/1: Wq = rho * D / (2 (1 - rho)).
    d, rate = 0.1, 7.0
    rho = rate * d
    assert mdc_mean_wait(rate, d, 1) == pytest.approx(rho * d / (2 * (1 - rho)))


def test_erlang_c_known_value() -> None:
    # c = 2, a = 1 Erlang: C = 1/3.
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)


def test_latency_is_infinite_at_or_beyond_capacity() -> None:
    perf = InstancePerf(batch_time_s=0.1)
    assert math.isinf(perf.mean_latency(10.0))
    assert perf.mean_latency(0.0) == pytest.approx(0.1)


@pytest.mark.parametrize(("servers", "rho"), [(1, 0.5), (1, 0.85), (2, 0.8), (4, 0.9)])
def test_mdc_model_matches_simulation(servers: int, rho: float) -> None:
    perf = InstancePerf(batch_time_s=0.05, servers=servers)
    rate = rho * perf.throughput
    arrivals = poisson_arrivals(rate, 200_000, seed=servers * 100 + int(rho * 100))
    simulated = float(np.mean(simulate_queue(perf, arrivals)[10_000:]))
    assert perf.mean_latency(rate) == pytest.approx(simulated, rel=0.04)


@pytest.mark.parametrize("rho", [0.05, 0.4, 0.8, 0.95])
def test_batching_model_tracks_simulation(rho: float) -> None:
    # Inception-v3 on p2.xlarge as published: 8 per batch, 415 batches/min.
    perf = InstancePerf(batch_time_s=60 / 415, batch_size=8, window_s=0.2)
    rate = rho * perf.throughput
    arrivals = poisson_arrivals(rate, 100_000, seed=int(rho * 1000))
    simulated = float(np.mean(simulate_queue(perf, arrivals)[5_000:]))
    model = perf.mean_latency(rate)
    # An approximation that errs high (buys capacity), but not by much.
    assert simulated * 0.99 <= model <= simulated * 1.25


def test_capacity_under_latency_inverts_mean_latency() -> None:
    perf = InstancePerf(batch_time_s=0.1)
    cap = perf.capacity_under_latency(0.3)
    assert perf.mean_latency(cap) == pytest.approx(0.3, rel=1e-3)
    assert perf.capacity_under_latency(0.05) == 0.0


def test_capacity_under_slo_meets_the_percentile_on_fresh_arrivals() -> None:
    perf = InstancePerf(batch_time_s=60 / 415, batch_size=8, window_s=0.2)
    cap = capacity_under_slo(perf, rt_max_s=0.6, sl_min=0.98)
    assert 0.8 * perf.throughput < cap < perf.throughput
    # Checked on draws the bisection never saw: met at the capacity, broken well beyond.
    at_cap = simulate_queue(perf, poisson_arrivals(cap, 40_000, seed=99))
    assert tail_latency(at_cap, 0.98) <= 0.6 * 1.05
    beyond = simulate_queue(
        perf, poisson_arrivals(min(cap * 1.07, 0.995 * perf.throughput), 40_000, seed=98)
    )
    assert tail_latency(beyond, 0.98) > 0.6


def test_cpu_without_batching_has_far_less_capacity_under_a_tail_slo() -> None:
    # Inception-v3 on c5.large: 284 r/m raw; p98 <= 600 ms holds only at ~1/3 of that.
    perf = InstancePerf(batch_time_s=60 / 284)
    cap = capacity_under_slo(perf, rt_max_s=0.6, sl_min=0.98)
    assert 0.25 * perf.throughput < cap < 0.45 * perf.throughput
    assert capacity_under_slo(InstancePerf(batch_time_s=0.7), 0.6, 0.98) == 0.0
