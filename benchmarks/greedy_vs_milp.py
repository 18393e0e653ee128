"""How far the online greedy planner is from the clairvoyant MILP optimum.

Replays greedy (re-planned every step, immediate retirement) over each seeded
random instance of ``provisioner.random_instances`` and divides its cost by the
MILP optimum on the same forecast, once with deferred launches (our default)
and once as the paper's Algorithm 1 (launch every chosen instance at once).

    .venv/bin/python benchmarks/greedy_vs_milp.py [instances=200]
"""

from __future__ import annotations

import statistics
import sys
import time

from provisioner.milp import solve_min_cost
from provisioner.random_instances import random_instance
from provisioner.rolling import replay_greedy

VARIANTS = (("deferred launches", True), ("paper (launch all)", False))


def main(count: int) -> None:
    started = time.perf_counter()
    ratios: dict[str, list[tuple[float, int]]] = {name: [] for name, _ in VARIANTS}
    for seed in range(count):
        forecast, options = random_instance(seed)
        best = solve_min_cost(forecast, options).cost
        for name, defer in VARIANTS:
            greedy = replay_greedy(forecast, options, defer_launches=defer).cost
            ratios[name].append((greedy / best, seed))
    print(f"{count} seeded instances, greedy replay cost / MILP optimum")
    for name, pairs in ratios.items():
        values = sorted(r for r, _ in pairs)
        worst, worst_seed = max(pairs)
        optimal = sum(v < 1 + 1e-6 for v in values)
        print(
            f"  {name:19s} median {statistics.median(values):.3f}  "
            f"p90 {values[int(0.9 * (len(values) - 1))]:.3f}  "
            f"worst {worst:.3f} (seed {worst_seed})  optimal {optimal}/{count}"
        )
    print(f"elapsed {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
