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
Solved with HiGHS through ``scipy.optimize.milp``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_matrix

from provisioner.greedy import OptionKey, PlannerOption, meets_slo


class MilpFailed(Exception):
    """HiGHS did not return an optimal solution (infeasible or out of time)."""


@dataclass(frozen=True)
class MilpPlan:
    cost: float
    options: tuple[PlannerOption, ...]
    counts: np.ndarray
    """Instances of each option per step, shape (options, steps); kept + new."""
    launches: np.ndarray
    """New instances started at each step, shape (options, steps)."""


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
    opts = [o for o in options if meets_slo(o, slo_s)]
    running = dict(running or {})
    have = np.array([running.get(o.key, 0) for o in opts], dtype=float)
    demand = np.asarray(forecast, dtype=float)
    n_opt, n_t = len(opts), demand.size
    if n_opt == 0:
        raise MilpFailed("no option meets the SLO")

    # Variable blocks, each (option, step) in row-major order: new n, kept k, launches u.
    block = n_opt * n_t

    def idx(b: int, i: int, t: int) -> int:
        return b * block + i * n_t + t

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

    rows = n_t + block + n_opt * max(n_t - 1, 0)
    a = lil_matrix((rows, 3 * block))
    lower_b = np.zeros(rows)
    r = 0
    for t in range(n_t):  # capacity
        for i, o in enumerate(opts):
            a[r, idx(0, i, t)] = o.capacity_rps
            a[r, idx(1, i, t)] = o.capacity_rps
        lower_b[r] = demand[t]
        r += 1
    for i in range(n_opt):  # u_t - n_t + n_{t-1} >= 0
        for t in range(n_t):
            a[r, idx(2, i, t)] = 1.0
            a[r, idx(0, i, t)] = -1.0
            if t > 0:
                a[r, idx(0, i, t - 1)] = 1.0
            r += 1
    for i in range(n_opt):  # k_{t-1} - k_t >= 0
        for t in range(1, n_t):
            a[r, idx(1, i, t - 1)] = 1.0
            a[r, idx(1, i, t)] = -1.0
            r += 1
    result = milp(
        c=cost,
        constraints=LinearConstraint(a.tocsr(), lower_b, np.inf),
        integrality=integrality,
        bounds=Bounds(np.zeros(3 * block), upper),
        options={"time_limit": time_limit_s},
    )
    if result.status != 0 or result.x is None:
        raise MilpFailed(f"HiGHS status {result.status}: {result.message}")
    x = np.round(result.x).reshape(3, n_opt, n_t)
    return MilpPlan(
        cost=float(result.fun),
        options=tuple(opts),
        counts=(x[0] + x[1]).astype(int),
        # From n, not u: u is free to float above Δn where the overhead is 0.
        launches=np.diff(x[0], axis=1, prepend=0).clip(min=0).astype(int),
    )
