"""The rise ``provisioner.rise_headroom`` carries where spill is late, on the trace's own
load and on a steady Poisson load of the same mean.

For each model's load (``run.MODELS``) on a window's history (the 3 h warm-up and the
window's first hour, seed 0), the rule's ``carried_rise`` after 2, 3 and 4 hours of it, at
a 2-minute lead and the allowance it has with nothing missed yet (``rise_miss_share``
0.75 of the 2 % SL_min leaves), beside the same on Poisson arrivals at the history's
mean rate: what the rule reads from the trace's bursts, and what it would read from
arrival noise alone.

    .venv/bin/python experiments/windows/rises.py [--days 10,12] [--models nasnet,...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from mark.sim.workloads import trace_workload
from provisioner.rise_headroom import DEFAULT_RISE_MISS_SHARE, carried_rise

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import MODELS

WINDOW_S = 5
LEAD_MINUTES = 2
HISTORY_HOURS = (2, 3, 4)
SHARE = DEFAULT_RISE_MISS_SHARE * (1 - 0.98)


def per_minute(arrivals: np.ndarray, since: float, hours: int) -> np.ndarray:
    """Minutes × 5 s windows of request rates from ``since``."""
    n = hours * 3600 // WINDOW_S
    slots = ((arrivals - since) // WINDOW_S).astype(np.int64)
    counts = np.bincount(slots[(slots >= 0) & (slots < n)], minlength=n)
    return np.asarray(counts / WINDOW_S, dtype=np.float64).reshape(-1, 60 // WINDOW_S)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", default="10,12")
    ap.add_argument("--models", default="nasnet,opennmt-ende")
    args = ap.parse_args()
    print("| model | day | mean r/s | carried rise after 2 / 3 / 4 h | steady Poisson |")
    print("|---|---|---|---|---|")
    for model in args.models.split(","):
        for day in (int(d) for d in args.days.split(",")):
            w = trace_workload("twitter", hours=8, start_day=day, rate_scale=MODELS[model])
            since = w.t0 - 3 * 3600
            arrivals = w.arrivals(int(w.start - 3 * 3600), int(w.start + 3600), 0)
            rates = per_minute(arrivals, since, max(HISTORY_HOURS))
            mean = float(rates.mean())
            rises = [carried_rise(rates[: h * 60], LEAD_MINUTES, SHARE) for h in HISTORY_HOURS]
            steady = np.random.default_rng(1).poisson(mean * WINDOW_S, rates.shape) / WINDOW_S
            noise = carried_rise(steady, LEAD_MINUTES, SHARE)
            cells = " / ".join("–" if r is None else f"{r:.2f}" for r in rises)
            print(
                f"| {model} | {day} | {mean:.2f} | {cells} | "
                f"{'–' if noise is None else f'{noise:.2f}'} |"
            )


if __name__ == "__main__":
    main()
