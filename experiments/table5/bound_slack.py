"""How loose the bound is at a steady load: the bound beside the cheapest whole fleet.

Issue #17 asks, where a model's bound is loose, how loose. A window of the Twitter
trace mixes that with what an online policy pays for rises and forecast error, so this
script takes those out: an hour of Poisson arrivals at a fixed rate, whose bound
(``mark.sim.bound.window_bound``: the LP with its batching floor, and the presence floor
where Lambda cannot answer in time) stands beside the cheapest fleet of whole instances
of one type that keeps SL_min within RT_max at that rate on the perf model: ``n``
instances of one on-demand type with ``n · C(n) ≥ rate``, ``C(n)`` the per-instance
capacity in a pool of ``n`` as the planner rates it (``provisioner.pooling.
capacity_in_pool``: each type's ``pool_batching`` figures, measured on the perf model's
queue at SL_min). That fleet knows the rate exactly and never changes, so its excess
over the bound is what the bound does not charge for: queueing (a batch must start
within RT_max − T_n of its first request, so a pool keeps instances idle) and whole
instances. It is a reference, not a bound; nothing else is assumed.

    .venv/bin/python experiments/table5/bound_slack.py [--models nasnet,opennmt-ende]
        [--rates 2,5,10,20] [--seed 0] [--hours 1]

Each model's default rates bracket its Table 5 load (the Twitter trace times
``run.py``'s factor). Prints one markdown table per model.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from mark.catalog import Catalog, load_catalog
from mark.sim.bound import window_bound
from mark.sim.models import SimModel, paper_model
from mark.sim.world import model_options
from provisioner.greedy import PlannerOption
from provisioner.pooling import capacity_in_pool

RATES = {
    "inception-v3": (20.0, 50.0, 100.0, 200.0),
    "nasnet": (2.0, 5.0, 10.0, 20.0),
    "lstm-ptb": (20.0, 50.0, 100.0, 200.0),
    "opennmt-ende": (0.5, 1.0, 2.0, 5.0),
}
"""Steady rates (requests/s) per model: around its Table 5 load (``run.py``'s factors)."""

MAX_FLEET = 200
"""The daemon's default fleet limit: no fleet larger is considered."""

BOOT_S = 120.0  # only enters the options' launch overhead, not their capacity


@dataclass(frozen=True)
class Fleet:
    """``count`` instances of ``instance_type`` at ``per_hour`` dollars an hour in all."""

    instance_type: str
    count: int
    per_hour: float


def cheapest_fleet(options: list[PlannerOption], rate: float) -> Fleet | None:
    """The cheapest ``n`` instances of one on-demand option with ``n · C(n) ≥ rate``, ``C(n)``
    as the planner rates a pool of ``n`` (``capacity_in_pool``); None within ``MAX_FLEET``."""
    best: Fleet | None = None
    for option in options:
        for n in range(1, MAX_FLEET + 1):
            if n * capacity_in_pool(option, n) >= rate:
                fleet = Fleet(option.instance_type, n, n * option.price_per_hour)
                if best is None or fleet.per_hour < best.per_hour:
                    best = fleet
                break
    return best


def poisson_arrivals(rate: float, seconds: float, seed: int) -> NDArray[np.float64]:
    """Sorted arrival times of a Poisson stream at ``rate`` over ``[0, seconds)``."""
    rng = np.random.default_rng(seed)
    n = int(rng.poisson(rate * seconds))
    return np.sort(rng.uniform(0.0, seconds, n))


@dataclass(frozen=True)
class Row:
    """One steady rate: the bound per hour, what set it, and the cheapest whole fleet."""

    rate: float
    bound_per_hour: float
    set_by: str
    fleet: Fleet | None
    fluid_per_hour: float
    """The bound without its burst rows (``mark.sim.bound_bursts``): what they add."""

    @property
    def ratio(self) -> float:
        """The fleet's cost over the bound (inf without a fleet)."""
        if self.fleet is None or self.bound_per_hour <= 0.0:
            return math.inf
        return self.fleet.per_hour / self.bound_per_hour


def measure(model: SimModel, catalog: Catalog, rate: float, hours: float, seed: int) -> Row:
    """The bound of ``hours`` of Poisson arrivals at ``rate`` (on-demand offerings and the
    simulated Lambda), per hour, beside the cheapest whole fleet of one type."""
    lead = model.rt_max_s + 60.0  # arrivals before the window: batch neighbours
    seconds = hours * 3600.0
    arrivals = poisson_arrivals(rate, lead + seconds, seed)
    bounds = [
        window_bound(
            model, catalog, arrivals, t0=lead, seconds=seconds, markets=["on-demand"], bursts=b
        )
        for b in (True, False)
    ]
    options = model_options(model, catalog, ["on-demand"], True, BOOT_S)
    set_by = str(bounds[0].summary()["set_by"])
    fleet = cheapest_fleet(options, rate)
    return Row(rate, bounds[0].value / hours, set_by, fleet, bounds[1].value / hours)


def table(name: str, rows: list[Row]) -> str:
    """One model's rows as a markdown table."""
    out = [
        f"**{name}** (on-demand, an hour of Poisson arrivals per rate)",
        "",
        "| rate r/s | bound without burst rows $/h | bound $/h | set by "
        "| cheapest whole fleet within the SLO | $/h | fleet / bound without | fleet / bound |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        fleet = (
            "none within the fleet limit"
            if r.fleet is None
            else (f"{r.fleet.count} × {r.fleet.instance_type}")
        )
        cost = "–" if r.fleet is None else f"{r.fleet.per_hour:.3f}"
        before = math.inf if r.fleet is None else r.fleet.per_hour / r.fluid_per_hour
        out.append(
            f"| {r.rate:g} | {r.fluid_per_hour:.3f} | {r.bound_per_hour:.3f} | {r.set_by} "
            f"| {fleet} | {cost} | {before:.2f}× | {r.ratio:.2f}× |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="nasnet,opennmt-ende", help="comma-separated")
    ap.add_argument("--rates", default=None, help="comma-separated r/s (default per model)")
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.hours <= 0:
        ap.error("--hours must be positive")
    catalog = load_catalog()
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        model = paper_model(name)
        rates = (
            [float(x) for x in args.rates.split(",")]
            if args.rates
            else list(RATES.get(name, (1.0, 10.0)))
        )
        if any(r <= 0 for r in rates):
            ap.error("every rate must be positive")
        rows = [measure(model, catalog, r, args.hours, args.seed) for r in rates]
        print(table(name, rows))
        print()


if __name__ == "__main__":
    main()
