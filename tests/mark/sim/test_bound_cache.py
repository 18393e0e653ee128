"""A solved bound is kept on disk by what it was solved on, and read back whole."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from mark.sim.bound import Bound
from mark.sim.compare import cached_bound


def _bound(value: float) -> Bound:
    return Bound(
        value=value,
        instance_cost=value,
        lambda_cost=0.25,
        requests=100,
        lambda_requests=3.5,
        missed=2.0,
        miss_budget=2,
        instance_hours={"c5.large/on-demand": 1.5},
        offerings=("c5.large/on-demand",),
        markets=("on-demand",),
        slot_s=5.0,
        solve_s=0.1,
        status="optimal",
        presence_floor=0.0,
        lp_value=value,
    )


def test_the_same_inputs_read_the_bound_back_and_other_inputs_solve_again(
    tmp_path: Path,
) -> None:
    solved: list[float] = []

    def solve(value: float) -> Bound:
        solved.append(value)
        return _bound(value)

    arrivals = np.array([0.5, 1.5, 2.5])
    first = cached_bound(tmp_path, lambda: solve(1.0), arrivals, ("on-demand",), None)
    again = cached_bound(tmp_path, lambda: solve(9.0), arrivals, ("on-demand",), None)
    assert again == first and solved == [1.0]
    other = cached_bound(tmp_path, lambda: solve(2.0), arrivals + 1.0, ("on-demand",), None)
    assert other.value == 2.0
    missed = cached_bound(tmp_path, lambda: solve(3.0), arrivals, ("on-demand",), 40)
    assert missed.value == 3.0 and solved == [1.0, 2.0, 3.0]
    # An infeasible bound (value inf) is kept as such.
    inf = cached_bound(tmp_path, lambda: solve(math.inf), arrivals, ("spot",), None)
    assert math.isinf(cached_bound(tmp_path, lambda: solve(0.0), arrivals, ("spot",), None).value)
    assert math.isinf(inf.value) and solved[-1] == math.inf
    # Without a folder nothing is kept.
    assert cached_bound(None, lambda: solve(5.0), arrivals).value == 5.0
