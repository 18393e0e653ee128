"""Seeded random planning problems, shared by the tests and the benchmarks.

Each has 2-6 offerings whose cost per request differs by up to 10x and whose
launch overhead is up to 30 % of an hour's price, and a forecast of 8-19 steps:
a sine wave of random phase span plus 15 % noise, so fleets must grow and shrink.
"""

from __future__ import annotations

import numpy as np

from provisioner.greedy import PlannerOption


def random_instance(seed: int) -> tuple[list[float], list[PlannerOption]]:
    rng = np.random.default_rng(seed)
    options = []
    for i in range(int(rng.integers(2, 7))):
        cap = float(rng.uniform(5, 200))
        price = cap * float(rng.uniform(0.002, 0.02))
        overhead = price * float(rng.uniform(0, 0.3))
        options.append(PlannerOption(f"t{i}", "on-demand", price, cap, overhead))
    steps = int(rng.integers(8, 20))
    base = rng.uniform(50, 600)
    wave = base * (1 + 0.6 * np.sin(np.linspace(0, rng.uniform(1, 6), steps)))
    forecast = np.maximum(0, wave + rng.normal(0, base * 0.15, steps))
    return [float(f) for f in forecast], options
