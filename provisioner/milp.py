"""The reference optimum: the paper's provisioning problem (§4.3) as a MILP.

    minimise   Σ_t Σ_i  x_{i,t}·P_i·step + O_i·max(n_{i,t} − n_{i,t−1}, 0)
    subject to Σ_i C_i·x_{i,t} ≥ F_t            for every step t
               x_{i,t} = n_{i,t} + k_{i,t}      (new + kept running instances)
               k_{i,t} ≤ k_{i,t−1}, k_{i,0} ≤ R_i   (a retired instance is gone)
               n, k integer ≥ 0

with the paper's per-instance SLO constraint folded into C_i (the rate one
instance sustains within the SLO) and offerings that cannot meet it dropped,
as the greedy planner does. Running instances cost their price but no launch
overhead. The max(·, 0) is linearised with a launch variable u ≥ Δn, u ≥ 0.

It is clairvoyant (it sees the whole horizon and may change the fleet every
step), so it is a lower bound for any online planner on the same forecast.
Solved with HiGHS through ``scipy.optimize.milp`` after dropping dominated
options (an exact reduction). With a time limit it returns the best schedule
found and HiGHS's dual bound, which is still a valid lower bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from provisioner.greedy import OptionKey, PlannerOption, meets_slo


class MilpFailed(Exception):
    """HiGHS found no feasible solution (infeasible, or out of time before one)."""


@dataclass(frozen=True)
class MilpPlan:
    cost: float
    """Cost of the returned schedule (optimal unless ``optimal`` is False)."""
    lower_bound: float
    """No schedule is cheaper: equal to ``cost`` when optimal, HiGHS's dual
    bound when the time limit stopped the search."""
    optimal: bool
    options: tuple[PlannerOption, ...]
    counts: np.ndarray
    """Instances of each option per step, shape (options, steps); kept + new."""
    launches: np.ndarray
    """New instances started at each step, shape (options, steps)."""


def prune_dominated(
    options: Sequence[PlannerOption], protected: set[OptionKey] | frozenset[OptionKey] = frozenset()
) -> list[PlannerOption]:
    """Drop options another one beats on price, capacity and overhead at once.

    Swapping each instance of a dominated option for one of its dominator keeps
    every step covered and costs no more, so some optimum never uses it: an
    exact reduction. Catalogs hold many such (older, pricier generations), and
    the MILP shrinks accordingly. Options with running instances are kept
    (those instances cost no launch overhead).
    """

    def beats(a: PlannerOption, b: PlannerOption) -> bool:
        no_worse = (
            a.price_per_hour <= b.price_per_hour
            and a.capacity_rps >= b.capacity_rps
            and a.launch_overhead <= b.launch_overhead
        )
        better = (
            a.price_per_hour < b.price_per_hour
            or a.capacity_rps > b.capacity_rps
            or a.launch_overhead < b.launch_overhead
        )
        return no_worse and better

    kept: list[PlannerOption] = []
    for i, o in enumerate(options):
        if o.key in protected:
            kept.append(o)
            continue
        dominated = any(
            beats(other, o) or (j < i and _terms(other) == _terms(o))
            for j, other in enumerate(options)
            if j != i
        )
        if not dominated:
            kept.append(o)
    return kept


def _terms(o: PlannerOption) -> tuple[float, float, float]:
    return (o.price_per_hour, o.capacity_rps, o.launch_overhead)


def solve_min_cost(
    forecast: Sequence[float],
    options: Sequence[PlannerOption],
    running: Mapping[OptionKey, int] | None = None,
    *,
    slo_s: float | None = None,
    step_s: float = 60.0,
    time_limit_s: float = 30.0,
) -> MilpPlan:
    """Cheapest fleet per step covering ``forecast`` (requests/s per step)."""
    running = dict(running or {})
    opts = prune_dominated([o for o in options if meets_slo(o, slo_s)], set(running))
    have = np.array([running.get(o.key, 0) for o in opts], dtype=float)
    demand = np.asarray(forecast, dtype=float)
    n_opt, n_t = len(opts), demand.size
    if n_opt == 0:
        raise MilpFailed("no option meets the SLO")

    # Variable blocks, each (option, step) in row-major order: new n, kept k, launches u.
    block = n_opt * n_t

    price = np.array([o.price_per_hour for o in opts]) * step_s / 3600.0
    cost = np.concatenate(
        [
            np.repeat(price, n_t),
            np.repeat(price, n_t),
            np.repeat([o.launch_overhead for o in opts], n_t),
        ]
    )
    upper = np.full(3 * block, np.inf)
    upper[block : 2 * block] = np.repeat(have, n_t)
    integrality = np.concatenate([np.ones(2 * block), np.zeros(block)])

    # Sparse constraint matrix from (row, column, value) triples.
    opt_i, step_t = np.divmod(np.arange(block), n_t)
    n_col, k_col, u_col = opt_i * n_t + step_t, block + opt_i * n_t + step_t, 2 * block
    caps = np.array([o.capacity_rps for o in opts])
    # Capacity: sum_i C_i (n_it + k_it) >= F_t, rows 0..n_t-1.
    rows = [step_t, step_t]
    cols = [n_col, k_col]
    vals = [caps[opt_i], caps[opt_i]]
    # Launches: u_it - n_it + n_i,t-1 >= 0, rows n_t..n_t+block-1.
    launch_row = n_t + np.arange(block)
    later = step_t > 0
    rows += [launch_row, launch_row, launch_row[later]]
    cols += [u_col + n_col, n_col, n_col[later] - 1]
    vals += [np.ones(block), -np.ones(block), np.ones(int(later.sum()))]
    # Kept running instances only go: k_i,t-1 - k_it >= 0.
    keep_row = n_t + block + np.arange(int(later.sum()))
    rows += [keep_row, keep_row]
    cols += [k_col[later] - 1, k_col[later]]
    vals += [np.ones(keep_row.size), -np.ones(keep_row.size)]
    n_rows = n_t + block + keep_row.size
    a = coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(n_rows, 3 * block),
    )
    lower_b = np.zeros(n_rows)
    lower_b[:n_t] = demand
    result = milp(
        c=cost,
        constraints=LinearConstraint(a.tocsr(), lower_b, np.inf),
        integrality=integrality,
        bounds=Bounds(np.zeros(3 * block), upper),
        options={"time_limit": time_limit_s},
    )
    if result.x is None:
        raise MilpFailed(f"HiGHS status {result.status}: {result.message}")
    x = np.round(result.x).reshape(3, n_opt, n_t)
    optimal = result.status == 0
    bound = float(result.fun) if optimal else float(getattr(result, "mip_dual_bound", 0.0))
    return MilpPlan(
        cost=float(result.fun),
        lower_bound=bound,
        optimal=optimal,
        options=tuple(opts),
        counts=(x[0] + x[1]).astype(int),
        # From n, not u: u is free to float above Δn where the overhead is 0.
        launches=np.diff(x[0], axis=1, prepend=0).clip(min=0).astype(int),
    )
