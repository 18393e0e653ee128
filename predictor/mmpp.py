"""Markov-modulated Poisson arrivals: bursty load that no forecaster can see coming.

A hidden continuous-time Markov chain switches between states, each with its
own Poisson rate; the sojourn in a state is exponential, so when a burst
starts and how long it lasts are memoryless. The paper (§5) uses such load
to show that the reactive paths (SLO monitor, Lambda spill) carry what the
predictor misses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from predictor.base import FloatArray, History
from predictor.traces import minute_max_rates

MMPP_START = np.datetime64("2026-01-05T00:00", "m")  # a Monday, arbitrary


@dataclass(frozen=True)
class Mmpp:
    """Rates (req/s) per state, mean sojourn (s) per state, and the jump matrix.

    `jumps[i][j]` is the probability of moving to j when leaving i (diagonal 0).
    The default is a calm state, a busy state and a rare surge.
    """

    rates: tuple[float, ...] = (40.0, 90.0, 220.0)
    mean_sojourn: tuple[float, ...] = (1800.0, 900.0, 240.0)
    jumps: tuple[tuple[float, ...], ...] = (
        (0.0, 0.8, 0.2),
        (0.7, 0.0, 0.3),
        (0.5, 0.5, 0.0),
    )

    def __post_init__(self) -> None:
        k = len(self.rates)
        if k < 1 or len(self.mean_sojourn) != k or len(self.jumps) != k:
            raise ValueError("rates, mean_sojourn and jumps must have one entry per state")
        if min(self.rates) < 0 or min(self.mean_sojourn) <= 0:
            raise ValueError("rates must be >= 0 and sojourns > 0")
        for i, row in enumerate(self.jumps):
            bad_row = len(row) != k or min(row) < 0
            if bad_row or (k > 1 and (abs(sum(row) - 1.0) > 1e-9 or row[i] != 0)):
                raise ValueError("each jumps row must be a distribution with a zero diagonal")

    def state_path(self, seconds: int, rng: np.random.Generator) -> NDArray[np.int64]:
        """The hidden state of each second."""
        k = len(self.rates)
        out = np.empty(seconds, dtype=np.int64)
        t, state = 0, int(rng.integers(k))
        while t < seconds:
            stay = max(1, round(rng.exponential(self.mean_sojourn[state])))
            out[t : t + stay] = state
            t += stay
            state = int(rng.choice(k, p=self.jumps[state])) if k > 1 else state
        return out

    def counts(self, seconds: int, seed: int = 0) -> FloatArray:
        """Per-second arrival counts, reproducible from `seed`."""
        rng = np.random.default_rng(seed)
        rate = np.asarray(self.rates)[self.state_path(seconds, rng)]
        return rng.poisson(rate).astype(np.float64)


def mmpp_history(days: float = 2.0, seed: int = 0, model: Mmpp | None = None) -> History:
    """Per-minute max 5 s rates of `days` of MMPP load (no gaps)."""
    seconds = round(days * 86400)
    counts = (model or Mmpp()).counts(seconds, seed)
    return minute_max_rates(counts, MMPP_START)
