"""Whole instances in a bound that holds: a relaxation solved exactly by dynamic programming.

`whole_cover.py` estimates what whole instances add by covering each slot's arrivals in that
slot, which no proof supports: a clairvoyant dispatcher may answer a request that arrives
late in a slot in the next one, and an instance may be there for part of a slot. This
script computes a bound that does hold, to measure whether it beats the LP
(`mark/sim/bound.py`). It does not, on Inception-v3 (`README.md`, 2026-11-28, morning), so
it stays an experiment.

The relaxation, for any simulated run that meets the SLO (notation as in
`mark/sim/bound.py`): slots of ``δ ≥ RT_max`` from ``t0``, plus one after the window.

- *Whole instances.* ``N_o[u]`` counts the runs of offering ``o`` whose extended run
  ``[s, e + RT_max)`` meets slot ``u``: an integer. A run of clipped length ``L`` meets at
  most ``(L + RT_max)/δ + 2`` slots and is billed ``b = max(60, L)``, so
  ``δ·Σ_u N_o[u] ≤ Σ_runs (L + RT_max + 2δ) ≤ κ_T·Σ_runs b`` with
  ``κ_T = 1 + (RT_max + 2δ)/60``: the EC2 bill is at least ``Σ_u Σ_o price_o·δ·N_o[u]/κ_T``.
- *Capacity.* The instance work done in slot ``u`` (each request's share of its batch,
  item 2 of the LP) is at most ``δ·Σ_o μ_o·N_o[u]``. So slot ``u``'s instances cost at least
  ``c*(work)``, the cheapest whole cover of that much work, over every offering but the
  dominated ones (dearer and no faster: exact for whole covers too). Capacities add up
  as they are (fifteen c5.large cover 70.95 requests' work in a 1 s slot, not 15·4).
- *Time.* A request that arrives before ``end(u) − RT_max`` is worked on in its slot only; a
  later one in its slot or the next. ``F_u`` is the work of slot ``u``'s requests done in
  ``u + 1`` (at most the late ones).
- *Lambda and misses.* A request not worked on by instances costs at least
  ``r = min(c_λ, λ)``: Lambda's least price, or ``λ`` for a miss, whose number the SLO
  caps at ``M`` (Lagrange: any ``λ ≥ 0`` gives a bound ``DP(λ) − λ·M``).

Slot ``u`` then costs at least ``g(E_u) = min_{k ≤ E_u} [c*(k) + r·(E_u − k)]`` with
``E_u = A_u − F_u + F_{u−1}``, and the ``F`` are chained from slot to slot: a dynamic
programme over ``F`` solves the relaxation exactly. It runs on whole requests. The
requests of a slot that no instance works on are whole, so ``E_u − work`` is a whole number
``m``, and ``c*(work) + r·m ≥ c*(⌊E_u⌋ − m) + r·m ≥ g(⌊E_u⌋)`` over whole ``k``; ``F``
rounded down moves ``E`` by less than one, so ``⌊E_u⌋ ≥ E' − 1`` for the rounded ``E'``,
and the programme charges ``g(E' − 1)`` (``g`` never falls as its argument grows).

    .venv/bin/python experiments/table5/whole_dp.py [--model inception-v3] [--day 10]
        [--hours 8] [--seed 0] [--slot-s 1.0] [--market on-demand] [--steps 30]
        [--fractional]
"""

from __future__ import annotations

import math
import time

import numpy as np
from numpy.typing import NDArray
from whole_cover import (
    cover_table,
    window_arrivals,
    window_parser,
)  # this directory: scripts run from it

from mark.catalog import load_catalog
from mark.sim.bound import bound_offerings, golden_max, lambda_terms, miss_budget
from mark.sim.models import paper_model


def slot_floor(cover: NDArray[np.float64], r: float) -> NDArray[np.float64]:
    """``g(K)`` for K = 0..len − 1 (module doc): the cheapest split of K requests between
    whole instances and Lambda or misses at ``r`` each."""
    js = np.arange(cover.size)
    return np.array([np.min(cover[: k + 1] + r * (k - js[: k + 1])) for k in js])


def chained(arrivals: NDArray[np.int64], late: NDArray[np.int64], g: NDArray[np.float64]) -> float:
    """The least total of ``g(E_u − 1)`` over every choice of the carried work ``F``."""
    floor = np.concatenate([[0.0], g[:-1]])  # floor[E] = g(E − 1), g(−1) = 0
    value = floor[np.arange(late[-1] + 1)]  # the slot after the window: carried work only
    for u in range(arrivals.size - 1, -1, -1):
        carried_in = np.arange((late[u - 1] if u > 0 else 0) + 1)
        carried_out = np.arange(late[u] + 1)
        demand = arrivals[u] - carried_out[None, :] + carried_in[:, None]
        value = (floor[demand] + value[None, :]).min(axis=1)
    return float(value[0])


def main() -> None:
    ap = window_parser(__doc__.splitlines()[0])
    ap.add_argument("--slot-s", type=float, default=1.0, help="δ, at least the model's RT_max")
    ap.add_argument("--steps", type=int, default=30, help="golden-section steps over λ")
    ap.add_argument(
        "--fractional",
        action="store_true",
        help="the same relaxation with fractions of instances: what whole ones add",
    )
    args = ap.parse_args()
    model = paper_model(args.model)
    rt, delta = model.rt_max_s, args.slot_s
    if delta < rt:
        raise SystemExit(f"--slot-s must be at least RT_max ({rt} s)")
    wl, drawn = window_arrivals(args)
    drawn = np.sort(drawn)
    seconds = float(wl.seconds)
    t = drawn[(drawn >= wl.t0) & (drawn < wl.t0 + seconds)] - wl.t0
    slots = math.ceil(seconds / delta)
    slot = np.minimum((t // delta).astype(np.int64), slots - 1)
    arrivals = np.bincount(slot, minlength=slots)
    late = np.bincount(slot[t >= (slot + 1) * delta - rt], minlength=slots)
    catalog = load_catalog()
    offerings = bound_offerings(model, catalog, [args.market])
    kappa = 1.0 + (rt + 2.0 * delta) / 60.0
    offers = [(o.rate_rps * delta, o.price_per_hour * delta / 3600.0) for o in offerings]
    top = int((arrivals + np.concatenate([[0], late[:-1]])).max()) + 1
    if args.fractional:
        unit = min(price / cap for cap, price in offers)
        cover = np.arange(top + 1) * unit / kappa
    else:
        cover = cover_table(top, [(cap, price / kappa) for cap, price in offers])
    lam = lambda_terms(model, catalog, 3072, 1000)
    c_lam = lam.cost_per_request if lam.latency_s <= rt else math.inf
    budget = miss_budget(int(arrivals.sum()), model.sl_min)

    def dual(weight: float) -> float:
        return chained(arrivals, late, slot_floor(cover, min(c_lam, weight))) - weight * budget

    started = time.perf_counter()
    most = 2.0 * max(price for _, price in offers)  # a miss is never worth more
    best = golden_max(dual, 0.0, most, args.steps)
    print(
        f"{args.model} on {wl.name}, {args.market}, {int(arrivals.sum()):,} requests, "
        f"slots of {delta:g} s (κ_T {kappa:.4f}): "
        f"{'fractional' if args.fractional else 'whole'}-instance bound ${best:.4f} "
        f"({time.perf_counter() - started:.0f} s)"
    )


if __name__ == "__main__":
    main()
