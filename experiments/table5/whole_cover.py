"""How much whole instances could add to the bound: an estimate, not a proven bound.

The bound (`mark/sim/bound.py`) lets a fraction of an instance serve. This script
covers each 5 s slot's arrivals with whole instances of the model's profiled types (each
at its best SLO-feasible batch rate, max_N N/T_N with T_N <= RT_max, at the catalog's
price in one market) and the same covers with fractions, each with and without the SLO's
miss budget (1 - SL_min of all requests, spent where it saves most: the best dual of a
Lagrange multiplier found by ternary search, exact for the fractional cover and a lower
bound of the whole one).

Why not a bound: an instance may serve part of a slot, at a run's start or end, so a
schedule can pay for less than whole instances in a slot; a valid integer form has to
track runs and their 60 s billing minimum. In steady minutes (no run starts or ends)
the whole cover is what any schedule pays, so its excess over the fractional one
estimates what whole instances would add.

    .venv/bin/python experiments/table5/whole_cover.py [--model inception-v3]
        [--trace twitter] [--day 10] [--hours 8] [--seed 0] [--rate-scale 1]
        [--market on-demand] [--warmup-s 10800]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from mark.catalog import load_catalog
from mark.cli.simulate_cmd import build_workload
from mark.sim.bound import bound_offerings, miss_budget, slot_counts
from mark.sim.models import paper_model
from mark.sim.workloads import Workload
from mark.sim.world import DEFAULT_WARMUP_S

SLOT_S = 5.0


def offerings(model_name: str, market: str) -> list[tuple[str, float, float]]:
    """(type, requests per slot, $ per slot) of each offering the bound buys in
    ``market`` (``mark.sim.bound.bound_offerings``: profiled types that meet RT_max, at
    their best SLO-feasible batch rate)."""
    offers = bound_offerings(paper_model(model_name), load_catalog(), [market])
    return [
        (o.instance_type, o.rate_rps * SLOT_S, o.price_per_hour * SLOT_S / 3600.0) for o in offers
    ]


GRID = 100  # capacities add up in hundredths of a request


def cover_table(top: int, offers: list[tuple[float, float]]) -> NDArray[np.float64]:
    """The cheapest whole cover of k requests' work, k = 0..top, by instances of
    (capacity, price) ``offers``. Capacities add up as they are, counted in hundredths of
    a request, each rounded up (a cover never dearer than the exact one: a bound built on
    it stays one). Before 2026-11-28 each instance's was rounded down to whole requests,
    which made every cover dearer: 15 c5.large covered 15·4 requests of a 1 s slot, not
    70.95."""
    best = np.full(top * GRID + 1, np.inf)
    best[0] = 0.0
    steps = [(max(1, math.ceil(cap * GRID - 1e-9)), price) for cap, price in offers]
    for u in range(1, top * GRID + 1):
        best[u] = min(best[max(0, u - step)] + price for step, price in steps)
    return np.minimum.accumulate(best[::-1])[::-1][::GRID]


def whole_costs(
    counts: NDArray[np.int64], offers: list[tuple[str, float, float]]
) -> NDArray[np.float64]:
    """The cheapest whole cover of k requests in one slot, for every k up to the most."""
    return cover_table(int(counts.max()) + 1, [(cap, price) for _, cap, price in offers])


def with_budget(
    counts: NDArray[np.int64],
    cost: Callable[[NDArray[np.int64]], NDArray[np.float64]],
    budget: int,
    most: float,
) -> float:
    """The best Lagrange dual of covering every slot with at most ``budget`` misses; a
    miss is worth at most ``most`` (a whole instance's slot), so the search ends there."""
    values, often = np.unique(counts, return_counts=True)

    def dual(lam: float) -> float:
        total = 0.0
        for c, n in zip(values, often, strict=True):
            left = np.arange(c, -1, -1)  # requests served when 0..c miss
            total += float((cost(left) + lam * np.arange(c + 1)).min()) * int(n)
        return total - lam * budget

    lo, hi = 0.0, most
    for _ in range(80):
        a, b = lo + (hi - lo) / 3.0, hi - (hi - lo) / 3.0
        lo, hi = (a, hi) if dual(a) < dual(b) else (lo, b)
    return dual(0.5 * (lo + hi))


def window_arrivals(args: argparse.Namespace) -> tuple[Workload, NDArray[np.float64]]:
    """The workload ``args`` name (--trace, --hours, --day, --rate-scale, --seed) and the
    arrivals `mark simulate` draws for it: from its warm-up (--warmup-s) on, same seed."""
    wl = build_workload(
        args.trace,
        hours=args.hours,
        start_day=args.day,
        rate_scale=args.rate_scale,
        time_scale=1.0,
        mean_rps=None,
        surge=0.5,
        base_rps=100.0,
        seed=args.seed,
    )
    return wl, wl.arrivals(int(wl.start - args.warmup_s), wl.end, args.seed)


def window_parser(description: str) -> argparse.ArgumentParser:
    """The options that name the window, its arrivals and the market (``window_arrivals``)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", default="inception-v3")
    ap.add_argument("--trace", default="twitter")
    ap.add_argument("--day", type=float, default=10.0)
    ap.add_argument("--hours", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--market", default="on-demand", choices=("on-demand", "spot"))
    ap.add_argument("--warmup-s", type=float, default=DEFAULT_WARMUP_S, help="as mark simulate's")
    return ap


def main() -> None:
    args = window_parser(__doc__.splitlines()[0]).parse_args()
    wl, drawn = window_arrivals(args)
    counts = slot_counts(drawn, wl.t0, float(wl.seconds), SLOT_S)
    offers = offerings(args.model, args.market)
    budget = miss_budget(int(counts.sum()), paper_model(args.model).sl_min)
    best = whole_costs(counts, offers)
    unit = min(price / cap for _, cap, price in offers)

    def whole(k: NDArray[np.int64]) -> NDArray[np.float64]:
        return best[k]

    def fractional(k: NDArray[np.int64]) -> NDArray[np.float64]:
        return k.astype(np.float64) * unit

    print(f"{args.model} on {wl.name}, {args.market}, {int(counts.sum()):,} requests")
    print("offerings (type, r/s, $/h):")
    for itype, cap, price in offers:
        print(f"  {itype:12s} {cap / SLOT_S:8.2f} {price * 3600.0 / SLOT_S:8.4f}")
    for name, f in (("whole", whole), ("fractional", fractional)):
        free = float(f(counts).sum())
        spent = with_budget(counts, f, budget, max(price for _, _, price in offers))
        print(f"{name:10s} cover: ${spent:.4f} with the miss budget, ${free:.4f} without")


if __name__ == "__main__":
    main()
